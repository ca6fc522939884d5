"""Use the Accordion reducers on your own DistributedDataParallel model.

    state = AccordionHookState(model, compressor="powersgd", rank=2)
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(state, accordion_hook)
    ...                              # train as usual
    state.set_level("layer4.1.conv2.weight", 1)     # or state.set_levels([...])

One reducer covers all parameters, so per-layer state (error memory, warm-start Q, level)
does not depend on how DDP groups parameters into buckets, nor on DDP rebuilding its buckets
after the first step. Each bucket is reduced with at most 3 batched collectives, synchronously
inside the hook (the hook returns an already completed Future of the bucket buffer).
"""

import torch

from . import build_reducer
from .stats import CommStats


class AccordionHookState:
    def __init__(self, model: torch.nn.Module, compressor: str = "powersgd", *, group=None,
                 **options):
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.param_names = [name for name, _ in named]
        self.reducer = build_reducer(compressor, [p for _, p in named], group=group, **options)
        self._position_of_ptr = {p.data_ptr(): i for i, (_, p) in enumerate(named)}
        self._position_of_name = {name: i for i, name in enumerate(self.param_names)}
        self.stats = CommStats()

    @property
    def layer_names(self) -> list[str]:
        """Names of the compressible parameters, in the order set_levels expects."""
        return [self.param_names[i] for i in self.reducer.tensor_of_layer]

    @property
    def levels(self) -> list:
        return list(self.reducer.levels)

    def set_levels(self, levels) -> None:
        """One level per entry of layer_names (None = the compressor default), from now on."""
        self.reducer.set_levels(levels)

    def set_level(self, param_name: str, level) -> None:
        if param_name not in self._position_of_name:
            raise KeyError(f"no trainable parameter named {param_name!r}")
        layer = self.reducer.layer_of_tensor[self._position_of_name[param_name]]
        if layer is None:
            raise ValueError(f"{param_name!r} has fewer than 2 dimensions: it is always sent "
                             "dense and takes no level")
        levels = self.levels
        levels[layer] = level
        self.set_levels(levels)

    def pop_stats(self) -> CommStats:
        """Communication since the last call (summed over buckets and steps), then reset."""
        stats, self.stats = self.stats, CommStats()
        return stats

    def positions(self, params) -> list[int]:
        try:
            return [self._position_of_ptr[p.data_ptr()] for p in params]
        except KeyError:
            raise ValueError("the DDP model's parameters are not those AccordionHookState was "
                             "built from (build the state from the model you wrap)") from None


def accordion_hook(state: AccordionHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket's gradients with the state's reducer."""
    grads = bucket.gradients()  # views into bucket.buffer(): reducing them fills the buffer
    positions = state.positions(bucket.parameters())
    state.stats += state.reducer.reduce_subset(positions, grads, state.reducer.levels)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future
