"""The one enginefacade of the project and the context that carries it.

Every query lives in a module of this package and runs inside
``context_manager.reader``/``writer``. The facade reads ``[database]`` of
``cfg.CONF`` when first used; tests point it at their own database with
``context_manager.patch_engine(engine)``.
"""

from oslo_db.sqlalchemy import enginefacade

context_manager = enginefacade.transaction_context()


@enginefacade.transaction_context_provider
class Context:
    """Carries the session of the current transaction."""


def get_engine():
    """The writer engine; starts the facade from cfg.CONF on first use."""
    return context_manager.writer.get_engine()
