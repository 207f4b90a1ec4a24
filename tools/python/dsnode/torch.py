"""dsnode.torch: dsnode gossip for a PyTorch model and optimizer.

    opt = dsnode.torch.GossipOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                       model)          # config: $DSNODE_CONFIG
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()                 # the optimizer step, then this step's round
        if opt.stopped: break      # SIGINT/SIGTERM: leave without lingering
    opt.settle()                   # before evaluating: the last round applied
    sys.exit(opt.finish())         # leave, model.bin, summary line; exit status

The model's CPU float32 parameters are copied once into one contiguous
buffer, and every parameter becomes a view into it (param.data), so the
engine mixes the model in place; the optimizer's references stay valid.
When the config averages gradients (node.group, or gossip.topology =
allreduce), step() first copies the parameters' gradients into one buffer
of the same layout, has the engine average it (the group's mean), and
copies the mean back before the optimizer step: every member of a group
then takes the same step. With torch.optim.SGD with momentum (dampening
0) over the model's parameters in order, the momentum buffers are views of
one flat buffer too, which the engine re-syncs a slice at a time (a member
that adopted a state starts over from zeros, then takes its group's) and,
with group.sparsify, zeroes where the group's sparse gradient has an entry
(momentum factor masking: without it a sparse group diverged). Other
optimizers keep their state to themselves. With group.overlap (CPU
parameters), a hook on each parameter's gradient accumulation copies the
gradient as backward writes it and hands each finished layer to the
engine, whose reduction then runs behind the rest of backward; one
backward per step then (a second one before step() raises dsnode.Error).
CUDA parameters (all on one device) are flattened the same way on their
device; the engine then works on a host mirror that it fills and copies
back through two callbacks (dsnode_register_copies), inside its own calls
only, so the tensors on the device are current whenever the program runs.
checkpoint() and resume= keep the optimizer's state and the step (and any
picklable `extra`, a data loader's position) in libdsnode's
checkpoint.bin beside the parameters and the engine's gossip state.
Build the optimizer before or after: its state is keyed by the parameter
objects, which do not change. Every process must start from the same
parameters (seed torch the same everywhere): the engine mixes what each
process changed since it registered, as `dsnode run` does.
"""
import bisect
import errno
import io
import time

import torch

import dsnode

# libdsnode's layer table holds at most this many rows (DS_MODEL_MAX_LAYERS).
MAX_LAYERS = 16


def layer_table(model):
    """[(name, offset, length)] in floats: one row per module (its weight
    and bias together, as dsnode's own layers), merged pairwise when there
    are more than MAX_LAYERS."""
    rows = []
    off = 0
    for pname, p in model.named_parameters():
        mod = pname.rsplit(".", 1)[0] if "." in pname else pname
        if rows and rows[-1][0] == mod and rows[-1][1] + rows[-1][2] == off:
            rows[-1][2] += p.numel()
        else:
            rows.append([mod, off, p.numel()])
        off += p.numel()
    while len(rows) > MAX_LAYERS:
        merged = []
        for i in range(0, len(rows), 2):
            if i + 1 < len(rows):
                a, b = rows[i], rows[i + 1]
                merged.append([a[0] + "+" + b[0], a[1], a[2] + b[2]])
            else:
                merged.append(rows[i])
        rows = merged
    return [(name[:15], o, n) for name, o, n in rows]


def sgd_momentum(optimizer, model):
    """True when `optimizer` is torch.optim.SGD with momentum over exactly
    `model`'s parameters, in their order, and dampening 0 in every group:
    its momentum buffers can then live in one flat buffer beside the
    parameters (GossipOptimizer hands it to the engine)."""
    if not isinstance(optimizer, torch.optim.SGD):
        return False
    params = []
    for g in optimizer.param_groups:
        if not g.get("momentum", 0) or g.get("dampening", 0):
            return False
        params.extend(g["params"])
    mine = list(model.parameters())
    return len(params) == len(mine) and all(a is b for a, b in zip(params, mine))


def flatten_(model):
    """Copy the parameters into one new float32 buffer and make each a view
    of it. Returns the buffer (1-D, contiguous)."""
    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    for name, p in model.named_parameters():
        if p.device != device:
            raise dsnode.Error(22, f"parameter {name} is on {p.device}, the first on {device}: "
                               "expected every parameter on one device")
        if p.dtype != torch.float32:
            raise dsnode.Error(22, f"parameter {name} is {p.dtype}: expected torch.float32")
    n = sum(p.numel() for p in params)
    flat = torch.empty(n, dtype=torch.float32, device=device)
    off = 0
    with torch.no_grad():
        for p in params:
            k = p.numel()
            flat[off:off + k].copy_(p.reshape(-1))
            p.data = flat[off:off + k].view_as(p)
            off += k
    return flat


class GossipOptimizer:
    """Wraps `optimizer` (any torch.optim.Optimizer over `model`'s
    parameters): step() runs the optimizer step, then the engine's step.
    config/overrides as dsnode.Engine; the engine joins the cluster here
    (blocks until cluster.min_members). handle_signals: SIGINT/SIGTERM stop
    the engine (see .stopped) instead of raising KeyboardInterrupt.
    resume: a checkpoint.bin (written by checkpoint()) to continue from:
    the parameters, the optimizer's state, steps_taken and .resumed_extra
    come back before the join. mirror: None (host mirrors when the
    parameters are on a GPU), or True/False to force the mirror path (the
    tests run it on the CPU)."""

    def __init__(self, optimizer, model, config=None, overrides=None, handle_signals=True,
                 resume=None, mirror=None):
        self.optimizer = optimizer
        self.model = model
        self.engine = dsnode.Engine(config=config, overrides=overrides,
                                    handle_signals=handle_signals)
        try:
            self.flat = flatten_(model)
            self.layers = layer_table(model)
            self.steps_taken = 0
            self.resumed_extra = None
            self.engine_s = 0.0  # time in the engine's calls on this thread
            self.grad = None
            if mirror is None:
                mirror = self.flat.device.type != "cpu"
            self.mirror = None
            if self.engine.reduces:
                self.grad = torch.zeros_like(self.flat)
            if mirror:
                # One host buffer stands for the parameters and the
                # gradient: the engine pulls a buffer before it reads the
                # mirror and pushes it right after it wrote it.
                pin = self.flat.device.type == "cuda"
                self.mirror = torch.empty(self.flat.numel(), dtype=torch.float32,
                                          pin_memory=pin)
                self.engine.register_copies(self._pull, self._push)
                self.engine.register_add(self._add)
            self.engine.set_backend("torch-" + self.flat.device.type)
            host = self.mirror if self.mirror is not None else self.flat
            # SGD's momentum, when the engine averages gradients: one flat
            # buffer of the parameters' layout, each parameter's
            # momentum_buffer a view of it, handed to the engine as opt
            # (re-synced by slices; with group.sparsify, masked where the
            # group's sparse gradient has an entry).
            self.mom = self.mom_host = None
            if self.grad is not None and sgd_momentum(optimizer, model):
                self.mom = torch.zeros_like(self.flat)
                self.mom_host = self.mom
                if self.mirror is not None:
                    self.mom_host = torch.zeros(self.flat.numel(), dtype=torch.float32,
                                                pin_memory=self.flat.device.type == "cuda")
                self._bind_momentum()
            if self.grad is not None:
                self.engine.register_grad(self.mirror if self.mirror is not None else self.grad,
                                          self.mom_host)
            self.engine.register(host, self.layers, self._adopt)
            self._step_ready = None  # this step's engine.ready(), once asked
            self._hooked = False
            self.layers_handed = 0  # group.overlap: layer_ready() calls from backward
            self.adds = 0  # with mirrors: rounds whose deltas were added in place
            if self.grad is not None and self.mirror is None and self.engine.overlaps:
                self._hook_layers()
            if resume is not None:
                self.engine.resume(resume, self._restore)
            self.engine.join()
        except BaseException:
            self.engine.close()
            raise

    def _hook_layers(self):
        """group.overlap: a hook after each parameter's gradient is
        accumulated (its AccumulateGrad node, as DDP hooks it) copies it
        into self.grad; the last parameter of a layer hands the layer to
        the engine, whose reduction then runs behind the rest of
        backward."""
        starts = [o for _, o, _ in self.layers]
        self._layer_params = [0] * len(self.layers)
        self._acc_nodes = []  # the hooks live as long as their nodes
        self._fired = []
        off = 0
        for i, p in enumerate(self.model.parameters()):
            k = p.numel()
            li = bisect.bisect_right(starts, off) - 1
            if p.requires_grad and k:
                self._layer_params[li] += 1
                node = p.expand_as(p).grad_fn.next_functions[0][0]
                node.register_hook(self._layer_hook(i, p, off, k, li))
                self._acc_nodes.append(node)
            self._fired.append(False)
            off += k
        self._left = list(self._layer_params)
        self._handed = [False] * len(self.layers)
        self._hooked = True

    def _layer_hook(self, i, p, off, k, li):
        def hook(*_):
            if self._fired[i]:
                raise dsnode.Error(errno.EINVAL, "group.overlap: a second backward before "
                                   "step() (gradients accumulated over several backward "
                                   "passes); expected one backward per step")
            self._fired[i] = True
            if self._step_ready is None:
                t0 = time.perf_counter()
                self._step_ready = self.engine.ready()
                self.engine_s += time.perf_counter() - t0
            if not self._step_ready:
                return
            with torch.no_grad():
                self.grad[off:off + k].copy_(p.grad.reshape(-1))
            self._left[li] -= 1
            if self._left[li] == 0:
                self._handed[li] = True
                t0 = time.perf_counter()
                self.engine.layer_ready(li)
                self.engine_s += time.perf_counter() - t0
                self.layers_handed += 1
        return hook

    def _end_step(self):
        self._step_ready = None
        if self._hooked:
            self._left = list(self._layer_params)
            self._handed = [False] * len(self.layers)
            self._fired = [False] * len(self._fired)

    def _device_buf(self, which):
        if which == dsnode.OPT:
            return self.mom
        return self.grad if which == dsnode.GRAD else self.flat

    def _host_buf(self, which):
        return self.mom_host if which == dsnode.OPT else self.mirror

    def _pull(self, which):
        self._host_buf(which).copy_(self._device_buf(which))

    def _push(self, which):
        self._device_buf(which).copy_(self._host_buf(which))
        if self.flat.device.type == "cuda":
            torch.cuda.current_stream(self.flat.device).synchronize()

    def _add(self, which, delta):
        # A round's deltas: one copy to the device and an add there, in
        # place of a pull and a push of the whole buffer.
        d = torch.frombuffer(delta, dtype=torch.float32)
        self._device_buf(which).add_(d.to(self.flat.device, non_blocking=False))
        self.adds += 1
        if self.flat.device.type == "cuda":
            torch.cuda.current_stream(self.flat.device).synchronize()

    def _restore(self, state, step):
        # The parameters are back (in place, through the engine); the
        # optimizer's state, our step and the program's extra here.
        d = torch.load(io.BytesIO(state), map_location=self.flat.device, weights_only=False)
        self.optimizer.load_state_dict(d["optimizer"])
        self._bind_momentum()
        self.steps_taken = int(step)
        self.resumed_extra = d.get("extra")

    def checkpoint(self, extra=None):
        """Write <node.data_dir>/checkpoint.bin: the parameters, the engine's
        gossip state and step, the optimizer's state_dict and `extra`
        (anything torch.save takes: a data loader's position). resume= of
        a later GossipOptimizer continues from it."""
        buf = io.BytesIO()
        torch.save({"optimizer": self.state_dict(), "extra": extra}, buf)
        t0 = time.perf_counter()
        self.engine.checkpoint(buf.getvalue())
        self.engine_s += time.perf_counter() - t0

    def _adopt(self, step):
        # The buffer holds the cluster's model at its step `step`: start
        # over from there, without our momentum.
        self.optimizer.state.clear()
        if self.mom is not None:
            self.mom.zero_()
            self._bind_momentum()
        self.steps_taken = step

    def _bind_momentum(self):
        """Each parameter's momentum_buffer a view of self.mom, holding
        what the optimizer's state had (a state loaded or cleared). A
        buffer preset to zeros takes SGD's first step as a fresh one does
        (momentum * 0 + gradient: sgd_momentum asks dampening 0)."""
        if self.mom is None:
            return
        off = 0
        with torch.no_grad():
            for p in self.model.parameters():
                k = p.numel()
                view = self.mom[off:off + k].view_as(p)
                st = self.optimizer.state[p]
                old = st.get("momentum_buffer")
                if old is None:
                    view.zero_()
                elif old.data_ptr() != view.data_ptr():
                    view.copy_(old)
                st["momentum_buffer"] = view
                off += k

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def stopped(self):
        return self.engine.stopped

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def ready(self):
        """False while a joiner keeps the cluster's pace or shadows it:
        do not train now (step() would skip the update)."""
        return self.engine.ready()

    def step(self, closure=None):
        """The optimizer step, then the engine's (this step's round, the
        last round's deltas applied in place). Returns the closure's loss;
        None when the engine said not now (the gradient is not applied)."""
        if self._step_ready is None:
            t0 = time.perf_counter()
            ready = self.engine.ready()
            self.engine_s += time.perf_counter() - t0
        else:
            ready = self._step_ready  # asked by the first layer's hook
        if not ready:
            self._end_step()
            return None
        if closure is not None and self.grad is not None:
            # The closure computes the gradient that must be averaged first.
            with torch.enable_grad():
                loss = closure()
            closure = None
        else:
            loss = None
        if self.grad is not None:
            t2 = time.perf_counter()
            self._reduce()
            self.engine_s += time.perf_counter() - t2
        out = self.optimizer.step(closure)
        loss = out if out is not None else loss
        t1 = time.perf_counter()
        self.engine.step()
        self.engine_s += time.perf_counter() - t1
        self.steps_taken += 1
        self._end_step()
        return loss

    def _reduce(self):
        """The parameters' gradients into self.grad (zeros for a parameter
        without one), the engine's mean, and back."""
        off = 0
        params = list(self.model.parameters())
        starts = [o for _, o, _ in self.layers]
        with torch.no_grad():
            for p in params:
                k = p.numel()
                if self._hooked and self._handed[bisect.bisect_right(starts, off) - 1]:
                    pass  # copied by its hook, its layer on the way
                elif p.grad is None:
                    self.grad[off:off + k].zero_()
                else:
                    self.grad[off:off + k].copy_(p.grad.reshape(-1))
                off += k
            self.engine.reduce()
            off = 0
            for p in params:
                k = p.numel()
                g = self.grad[off:off + k].view_as(p)
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
                off += k

    def settle(self):
        """Finish the open round: the parameters are final until the next
        step (evaluate after this)."""
        self.engine.settle()

    def report(self, loss, test_acc=-1.0, samples_per_s=0.0):
        t0 = time.perf_counter()
        lr = self.optimizer.param_groups[0].get("lr", 0.0)
        self.engine.report(float(loss), test_acc, float(lr), samples_per_s)
        self.engine_s += time.perf_counter() - t0

    def crossing_us(self, calls=20000):
        """The cost of one call into libdsnode through ctypes (a call that
        does nothing but read a flag), in microseconds."""
        t0 = time.perf_counter()
        for _ in range(calls):
            self.engine.stopped
        return (time.perf_counter() - t0) / calls * 1e6

    def report_eval(self, test_loss, test_acc):
        self.engine.report_eval(float(test_loss), float(test_acc))

    def state_dict(self):
        sd = self.optimizer.state_dict()
        if self.mom is not None:
            # Copies: a view saved by torch.save carries its whole storage.
            sd["state"] = {k: {n: (v.clone() if n == "momentum_buffer" and v is not None
                                   else v) for n, v in st.items()}
                           for k, st in sd["state"].items()}
        return sd

    def load_state_dict(self, sd):
        self.optimizer.load_state_dict(sd)
        self._bind_momentum()

    def finish(self, failed=False, paused=False):
        """Leave the cluster, write model.bin, print the summary line, close
        the engine. Returns the process exit status (0 done or paused, 1
        failed, 128 + signal stopped). paused: stopped on purpose, to be
        resumed from a checkpoint (status=paused)."""
        try:
            self.engine.leave(failed=failed, paused=paused)
        except dsnode.Error:
            pass  # the summary already says status=failed
        status = self.engine.exit_status
        self.engine.close()
        return status
