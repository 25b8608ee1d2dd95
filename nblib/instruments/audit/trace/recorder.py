"""The recorder's shape, shared by both backends: one CaptureTrace per capture made inside a
`with` block, labelled by whatever rec(...) says, and every patch it installs undone on exit."""

import contextlib

from nblib.instruments.audit.trace.records import CaptureTrace


class Recording:
    """Collects one CaptureTrace per capture started inside the `with` block.

    Subclasses install their hooks with self._patch(owner, name, value) (or push an undo with
    self._undo.append) in _install(), and start each capture's trace with self.new_trace();
    __exit__ undoes them all, in reverse, also when the block raised, and drops every reference a
    hook held, so nothing of a recording outlives it."""

    def __init__(self, dev, analyse=None):
        self.dev = dev
        self.captures = []
        self._label = {}
        self._analyse = analyse  # (traces, names=) -> report; nblib.instruments.audit.audit
        self._undo = []
        # CUDA only: called before each op is queued in a capture, with the index it will have
        self.before_op = None

    def __call__(self, bucket=None, **label):
        """rec(bucket) -> a context manager labelling the captures made inside it; pass `rec` as
        Runner.capture(record=rec) and every trace carries its bucket."""
        if bucket is not None:
            label = dict(bucket=bucket, **label)
        return self._labelled(label)

    @property
    def label(self):
        """The labels of the captures made now (inside rec(...) blocks), e.g. {"bucket": 8}."""
        return dict(self._label)

    @contextlib.contextmanager
    def _labelled(self, label):
        prev, self._label = self._label, {**self._label, **label}
        try:
            yield self
        finally:
            self._label = prev

    def new_trace(self):
        """A new CaptureTrace for a capture beginning now, labelled with the current labels, kept
        in self.captures."""
        t = CaptureTrace(label=dict(capture=len(self.captures), **self._label), backend=self.dev.name)
        self.captures.append(t)
        return t

    def report(self, names=None):
        """The audit of every complete capture recorded so far (nblib.instruments.audit.Report)."""
        if self._analyse is None:
            raise RuntimeError(
                "this recording has no audit attached: use nblib.instruments.audit.recording(dev)"
            )
        return self._analyse(self.captures, names=names)

    # -- install / uninstall ------------------------------------------------------------------------
    def _patch(self, owner, name, value):
        """Set owner.name = value until the recording ends (an inherited name is deleted again)."""
        if name in owner.__dict__:
            orig = owner.__dict__[name]
            self._undo.append(lambda: setattr(owner, name, orig))
        else:
            self._undo.append(lambda: delattr(owner, name))
        setattr(owner, name, value)

    def _install(self):
        raise NotImplementedError

    def _stop(self):
        """Backend cleanup before the patches come off (e.g. a capture left open)."""

    def __enter__(self):
        try:
            self._install()
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc):
        try:
            self._stop()
        finally:
            self._restore()
        return False

    def _restore(self):
        undo, self._undo = self._undo, []
        while undo:
            undo.pop()()
