"""dsnode: a dsnode engine for any Python training loop, over libdsnode.

    import dsnode
    e = dsnode.Engine(config="node.ini", overrides={"node.name": "n0"})
    if e.reduces: e.register_grad(grad)   # node.group or topology allreduce
    e.register(flat, [("fc1", 0, 200960), ...], adopt=on_adopt)  # float32 array
    e.join()
    for ...:
        if e.ready(): backward into grad; e.reduce(); optimizer step on flat; e.step()
    e.leave(); sys.exit(e.exit_status)

The calls are those of include/dsnode/dsnode.h (docs/api.md), through
ctypes: no compiler is needed beyond the meson build of libdsnode. Every
failure raises dsnode.Error with the library's errno and message (for a bad
config: "FILE:LINE: section.key: expected ..., found ...").

For PyTorch, dsnode.torch.GossipOptimizer wraps an optimizer and a model.

The library is found through $DSNODE_LIB (a path), then the build tree
beside this package (build/node/api/libdsnode.so), then the system's
loader (libdsnode.so.1, as installed by `meson install`).
"""
import ctypes
import ctypes.util
import errno as _errno
import os

__all__ = ["Engine", "Error", "library_path"]

ABI_VERSION = 1
DONE, FAILED, PAUSED = 0, 1, 2
PARAMS, GRAD, OPT = 0, 1, 2


class Error(Exception):
    """A libdsnode call failed: .errno (positive) and .message."""

    def __init__(self, err, message):
        self.errno = err
        self.message = message
        name = _errno.errorcode.get(err, str(err))
        super().__init__(f"{message} ({name})")


class _Layer(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("offset", ctypes.c_size_t),
                ("length", ctypes.c_size_t)]


class _Stats(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("rounds", ctypes.c_uint64),
                ("view_size", ctypes.c_uint32), ("exchanges_ok", ctypes.c_uint64),
                ("exchanges_failed", ctypes.c_uint64), ("bytes_sent", ctypes.c_uint64),
                ("bytes_received", ctypes.c_uint64), ("wait_s", ctypes.c_double),
                ("max_round_s", ctypes.c_double)]


_ADOPT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int64)
_COPY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
_ADD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                        ctypes.POINTER(ctypes.c_float))
_RESTORE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t)


def _candidates():
    env = os.environ.get("DSNODE_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", ".."))
    for build in ("build", "build-asan", "build-tsan"):
        yield os.path.join(root, build, "node", "api", "libdsnode.so")
    yield "libdsnode.so.1"
    found = ctypes.util.find_library("dsnode")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as ex:
            tried.append(f"{path} ({ex})")
            continue
        lib._path = path
        return lib
    raise ImportError("dsnode: libdsnode not found (tried " + ", ".join(tried) +
                      "); build it (meson) or set DSNODE_LIB")


def _errno_callback(fn, ctype):
    """fn wrapped for the engine: 0 when it returns, -EIO when it raises
    (the engine takes an errno, not an exception)."""
    def cb(_ctx, arg):
        try:
            fn(int(arg))
            return 0
        except Exception:  # noqa: BLE001 -- any failure becomes the errno
            return -_errno.EIO
    return ctype(cb)


def _declare(lib):
    P = ctypes.c_void_p
    sig = {
        "dsnode_version": (ctypes.c_char_p, []),
        "dsnode_abi_version": (ctypes.c_uint, []),
        "dsnode_error": (ctypes.c_char_p, []),
        "dsnode_open_abi": (ctypes.c_int, [ctypes.POINTER(P), ctypes.c_char_p,
                                           ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
                                           ctypes.c_uint]),
        "dsnode_name": (ctypes.c_char_p, [P]),
        "dsnode_reduces": (ctypes.c_int, [P]),
        "dsnode_overlaps": (ctypes.c_int, [P]),
        "dsnode_layer_ready": (ctypes.c_int, [P, ctypes.c_size_t]),
        "dsnode_register_grad": (ctypes.c_int, [P, P, P]),
        "dsnode_register_copies": (ctypes.c_int, [P, _COPY, _COPY, P]),
        "dsnode_register_add": (ctypes.c_int, [P, _ADD]),
        "dsnode_resume": (ctypes.c_int, [P, ctypes.c_char_p, _RESTORE, P]),
        "dsnode_checkpoint": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_size_t]),
        "dsnode_set_backend": (ctypes.c_int, [P, ctypes.c_char_p]),
        "dsnode_reduce": (ctypes.c_int, [P]),
        "dsnode_register": (ctypes.c_int, [P, P, ctypes.c_size_t, ctypes.POINTER(_Layer),
                                           ctypes.c_size_t, _ADOPT, P]),
        "dsnode_join": (ctypes.c_int, [P]),
        "dsnode_ready": (ctypes.c_int, [P]),
        "dsnode_step": (ctypes.c_int, [P]),
        "dsnode_settle": (ctypes.c_int, [P]),
        "dsnode_report": (ctypes.c_int, [P, ctypes.c_double, ctypes.c_double, ctypes.c_double,
                                         ctypes.c_double]),
        "dsnode_report_eval": (ctypes.c_int, [P, ctypes.c_double, ctypes.c_double]),
        "dsnode_stats_get": (ctypes.c_int, [P, ctypes.POINTER(_Stats)]),
        "dsnode_stop": (None, [P, ctypes.c_int]),
        "dsnode_stopped": (ctypes.c_int, [P]),
        "dsnode_handle_signals": (ctypes.c_int, [P]),
        "dsnode_leave": (ctypes.c_int, [P, ctypes.c_int]),
        "dsnode_exit_status": (ctypes.c_int, [P]),
        "dsnode_close": (None, [ctypes.POINTER(P)]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    if lib.dsnode_abi_version() != ABI_VERSION:
        raise ImportError(f"dsnode: {lib._path} has ABI {lib.dsnode_abi_version()}, this "
                          f"package speaks ABI {ABI_VERSION}")
    return lib


_lib = _declare(_load())


def library_path():
    """The libdsnode this package loaded."""
    return _lib._path


def version():
    return _lib.dsnode_version().decode()


def _check(rc):
    if rc < 0:
        raise Error(-rc, _lib.dsnode_error().decode(errors="replace"))
    return rc


def _float_buffer(buf, what="register"):
    """(address, count) of a contiguous float32 CPU numpy array or torch
    tensor; dsnode.Error otherwise."""
    if hasattr(buf, "data_ptr"):  # torch.Tensor
        if buf.device.type != "cpu" or str(buf.dtype) != "torch.float32" or \
                not buf.is_contiguous():
            raise Error(_errno.EINVAL, f"{what}: expected a contiguous float32 CPU tensor, "
                        f"found {buf.dtype} on {buf.device}")
        return buf.data_ptr(), buf.numel()
    ai = getattr(buf, "__array_interface__", None)
    if ai is None or ai["typestr"] != "<f4" or ai.get("strides") is not None:
        raise Error(_errno.EINVAL, f"{what}: expected a contiguous float32 numpy array or "
                    "torch tensor")
    n = 1
    for k in ai["shape"]:
        n *= k
    return ai["data"][0], n


class Engine:
    """One dsnode engine (dsnode_open). config: the ini file (default:
    $DSNODE_CONFIG, as `dslaunch local -- CMD` sets it; None: defaults
    only); overrides: {"section.key": value} applied after the file, as
    `dsnode run --set`. handle_signals: SIGINT/SIGTERM stop the engine
    (dsnode_handle_signals) instead of raising KeyboardInterrupt; the loop
    then sees .stopped. One thread drives an engine."""

    def __init__(self, config=None, overrides=None, handle_signals=False):
        if config is None:
            config = os.environ.get("DSNODE_CONFIG")
        sets = [f"{k}={v}" for k, v in (overrides or {}).items()]
        arr = (ctypes.c_char_p * max(1, len(sets)))(*[s.encode() for s in sets])
        h = ctypes.c_void_p()
        _check(_lib.dsnode_open_abi(ctypes.byref(h), config.encode() if config else None, arr,
                                    len(sets), ABI_VERSION))
        self._h = h
        self._keep = None
        self._keep_grad = None
        self._keep_copies = None
        self._keep_restore = None
        if handle_signals:
            _check(_lib.dsnode_handle_signals(self._h))

    def _handle(self):
        if not self._h:
            raise Error(_errno.EINVAL, "the engine is closed")
        return self._h

    @property
    def name(self):
        return _lib.dsnode_name(self._handle()).decode()

    @property
    def reduces(self):
        """True when the config averages gradients every step (node.group,
        or gossip.topology = allreduce): register_grad() before
        register(), and reduce() between backward and the optimizer step."""
        return _check(_lib.dsnode_reduces(self._handle())) == 1

    @property
    def overlaps(self):
        """True when layer_ready() starts reductions (group.overlap in a
        group, no register_copies()): hand each layer over from inside
        backward, as soon as its gradient is final."""
        return _check(_lib.dsnode_overlaps(self._handle())) == 1

    def layer_ready(self, layer):
        """group.overlap: layer `layer` (its index in register()'s table)
        has its final gradient in the gradient buffer: its reduction over
        the group starts now, on an engine thread, behind the rest of
        backward. Between ready() and reduce(), each layer at most once a
        step, the same layers in the same order on every member; that
        range of the gradient is not written again until reduce()."""
        _check(_lib.dsnode_layer_ready(self._handle(), int(layer)))

    def register_copies(self, pull, push):
        """The program keeps its tensors elsewhere (a GPU): the buffers of
        register_grad() and register() are host mirrors. pull(which) fills
        the mirror of buffer `which` (dsnode.PARAMS, GRAD or OPT) from the
        program's memory, push(which) copies the mirror back; the engine
        calls them on this thread, inside its calls, before it reads a
        mirror and after it wrote one. The mirrors may be one buffer.
        Before register_grad() and register()."""
        c_pull, c_push = _errno_callback(pull, _COPY), _errno_callback(push, _COPY)
        _check(_lib.dsnode_register_copies(self._handle(), c_pull, c_push, None))
        self._keep_copies = (c_pull, c_push)

    def register_add(self, add):
        """With register_copies(): add(which, delta) adds delta, a ctypes
        float array of the buffers' length (buffer protocol: wrap it with
        torch.frombuffer or numpy.frombuffer; valid during the call only),
        to buffer `which` in the program's memory. A gossip round's end
        then hands its deltas over instead of a pull and a push of the
        parameters. After register_copies(), before register()."""
        def cb(_ctx, which, delta):
            try:
                arr = (ctypes.c_float * self._n).from_address(ctypes.addressof(delta.contents))
                add(int(which), arr)
                return 0
            except Exception:  # noqa: BLE001 -- any failure becomes the errno
                return -_errno.EIO
        c_add = _ADD(cb)
        _check(_lib.dsnode_register_add(self._handle(), c_add))
        self._keep_add = c_add

    def set_backend(self, name):
        """What the summary line shows as backend= (default "client")."""
        _check(_lib.dsnode_set_backend(self._handle(), str(name).encode()))

    def resume(self, path, restore):
        """Continue from a checkpoint written by checkpoint(): the buffer
        gets its parameters, restore(state, step) gets the bytes the
        program gave checkpoint() and the step (it puts its own state back;
        an exception refuses the checkpoint, its text in the dsnode.Error),
        then the engine its gossip state and step. After register(), before
        join(). The engine may call restore again inside join() or ready()
        (a restarted node that keeps its own state over the cluster's)."""
        def cb(_ctx, state, n, step, why, why_len):
            try:
                restore(ctypes.string_at(state, n) if n else b"", int(step))
                return 0
            except Exception as ex:  # noqa: BLE001 -- its text goes back to the caller
                msg = (f"{type(ex).__name__}: {ex}".encode(errors="replace")
                       [:max(0, why_len - 1)])
                ctypes.memmove(why, msg + b"\0", len(msg) + 1)
                return -_errno.EINVAL
        c_cb = _RESTORE(cb)
        self._keep_restore = c_cb  # the engine keeps it until close()
        _check(_lib.dsnode_resume(self._handle(), str(path).encode(), c_cb, None))

    def checkpoint(self, state=b""):
        """Write <node.data_dir>/checkpoint.bin: the parameters, the step,
        the engine's gossip state and `state`, the program's own bytes
        (its optimizer, data position), which resume() hands back. Atomic:
        a failure leaves the previous checkpoint."""
        state = bytes(state)
        _check(_lib.dsnode_checkpoint(self._handle(), state, len(state)))

    def register_grad(self, grad, opt=None):
        """grad (and opt, the optimizer's momentum, or None): contiguous
        float32 CPU arrays as long as the coming register()'s buffer, in
        its layout; kept alive by the engine until close()."""
        gptr, gn = _float_buffer(grad, "register_grad")
        optr, on = _float_buffer(opt, "register_grad") if opt is not None else (None, 0)
        if opt is not None and on != gn:
            raise Error(_errno.EINVAL, f"register_grad: grad has {gn} floats and opt {on}; "
                        "expected the same length")
        _check(_lib.dsnode_register_grad(self._handle(), ctypes.c_void_p(gptr),
                                         ctypes.c_void_p(optr) if optr else None))
        self._keep_grad = (grad, opt, gn)

    def reduce(self):
        """After backward, before the optimizer step: the gradient buffer
        becomes the group's (or the view's) mean, in place."""
        _check(_lib.dsnode_reduce(self._handle()))

    def register(self, buffer, layers, adopt):
        """buffer: the parameters, one contiguous float32 array on the CPU
        (a numpy array or a torch tensor), mixed in place and kept alive by
        the engine until close(); layers: [(name, offset, length)] in
        floats; adopt(step): the buffer now holds the cluster's state at
        optimizer step `step` (reset the optimizer's state)."""
        ptr, n = _float_buffer(buffer)
        self._n = n
        if self._keep_grad is not None and self._keep_grad[2] != n:
            raise Error(_errno.EINVAL, f"register: {n} floats, but register_grad's buffer has "
                        f"{self._keep_grad[2]}; expected the same length")
        table = (_Layer * len(layers))(*[_Layer(str(nm).encode(), off, ln)
                                          for nm, off, ln in layers])

        c_cb = _errno_callback(adopt, _ADOPT)
        _check(_lib.dsnode_register(self._handle(), ctypes.c_void_p(ptr), n, table,
                                    len(layers), c_cb, None))
        self._keep = (buffer, table, c_cb)

    def join(self):
        _check(_lib.dsnode_join(self._handle()))

    def ready(self):
        return _check(_lib.dsnode_ready(self._handle())) == 1

    def step(self):
        _check(_lib.dsnode_step(self._handle()))

    def settle(self):
        _check(_lib.dsnode_settle(self._handle()))

    def report(self, loss, test_acc=-1.0, lr=0.0, samples_per_s=0.0):
        _check(_lib.dsnode_report(self._handle(), loss, test_acc, lr, samples_per_s))

    def report_eval(self, test_loss, test_acc):
        _check(_lib.dsnode_report_eval(self._handle(), test_loss, test_acc))

    def stats(self):
        s = _Stats()
        _check(_lib.dsnode_stats_get(self._handle(), ctypes.byref(s)))
        return {k: getattr(s, k) for k, _ in _Stats._fields_}

    def stop(self, sig=15):
        _lib.dsnode_stop(self._handle(), sig)

    @property
    def stopped(self):
        return _lib.dsnode_stopped(self._handle())

    def leave(self, failed=False, paused=False):
        """Leave, write model.bin, print the summary line: status=failed
        (failed), paused (paused: to be resumed; exit status 0), stopped
        (a stop request) or done."""
        _check(_lib.dsnode_leave(self._handle(), FAILED if failed else
                                 PAUSED if paused else DONE))

    @property
    def exit_status(self):
        return _lib.dsnode_exit_status(self._h) if self._h else 1

    def close(self):
        if self._h:
            _lib.dsnode_close(ctypes.byref(self._h))
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()
