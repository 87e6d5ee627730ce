"""A full disk in a child process, for the CLI tests of what a full disk leaves."""

#: Loaded into the child (sitecustomize): every temporary file written under $SAGO_TEST_FULL_DISK finds the disk full.
FULL_DISK = '''
import errno, os
_target, _fdopen = os.environ["SAGO_TEST_FULL_DISK"], os.fdopen

class _Full:
    def __init__(self, f): self.f = f
    def __enter__(self): return self
    def __exit__(self, *exc): self.f.close()
    def write(self, data): raise OSError(errno.ENOSPC, "No space left on device")
    def __getattr__(self, name): return getattr(self.f, name)

def _fdopen_full(fd, *args, **kwargs):
    f = _fdopen(fd, *args, **kwargs)
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f
    return _Full(f) if name.startswith(_target) and name.endswith(".tmp") else f

os.fdopen = _fdopen_full
'''
