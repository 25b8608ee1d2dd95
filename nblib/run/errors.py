"""Why a suite run stops. Library code raises these; nblib.run.cli turns each into its one-line
message on stderr and exit status 1, so a caller in Python (a test, a sweep) can tell them apart."""


class SuiteError(Exception):
    """A suite run that cannot go on; the message says why and where the earlier results are."""


class NotebookFailed(SuiteError):
    """A notebook failed: it is recorded failed in index.json, with its failing cell."""


class LaneFailed(SuiteError):
    """A lane's process exited non-zero: every lane ran to its end, the notebook after them did not."""


class Interrupted(SuiteError):
    """SIGTERM landed outside a notebook's execution (between two notebooks)."""


class Stopped(SystemExit):
    """SIGTERM while a notebook ran (a `timeout` around the run, a job scheduler): the notebook is
    recorded as failed before the run stops, never left looking unfinished or ok.

    The one SystemExit here, raised by the signal handler only: the signal lands wherever
    papermill's event loop is, inside one of nbclient's tasks or callbacks, where asyncio keeps any
    exception but SystemExit and KeyboardInterrupt as that task's result, which nothing reads, and
    the notebook would run on to the end; SystemExit it raises through. Once out of the loop, the
    suite records it, and one that lands between notebooks leaves the run as Interrupted."""
