"""Shared checks of the command-line tests."""

# [database]connection values no command can use, each with what its one
# error line must say (what is wrong, and what to write instead); the
# password must not show.
UNWORKABLE_URLS = [
    ('postgres://u:secretpw@127.0.0.1/db', ["unknown database type 'postgres'",
                                            'postgresql+psycopg2://']),
    ('mysql+mysqldb://u:secretpw@127.0.0.1/db', ["driver 'mysqldb', which is "
                                                 'not installed',
                                                 'mysql+pymysql://']),
    ('mysql://u:secretpw@127.0.0.1', ['names no database', '/DBNAME']),
    ('secretpw', ['is not a database URL', 'sqlite:///PATH']),
]


def assert_one_line_error(prog, code, stderr, *fragments, exit_code=1):
    """``prog`` failed with ``exit_code`` and one ``prog: error:`` line
    holding ``fragments``."""
    assert code == exit_code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f'{prog}: error: ')
    for fragment in fragments:
        assert fragment in lines[0]
    assert 'Traceback' not in stderr
