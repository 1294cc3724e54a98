"""Shared checks of the command-line tests."""


def assert_one_line_error(prog, code, stderr, *fragments):
    """``prog`` failed with status 1 and one ``prog: error:`` line holding ``fragments``."""
    assert code == 1, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f'{prog}: error: ')
    for fragment in fragments:
        assert fragment in lines[0]
    assert 'Traceback' not in stderr
