"""Per-layer transport precision: each layer's gradient sent in fp32, bf16 or fp8, summed in fp32.

A level is the bits per value on the wire (config.PrecisionBits): 32 sends the layer through the
exact dense all-reduce every reducer has (bit-identical to no compression); 16 and 8 send it in
bf16 or fp8 (e4m3 or e5m2, `fp8_format`) with one fp32 scale per `block_size` values.

Low-precision values travel, sums do not happen in them. A layer of n values is cut into one
piece of p = ceil(n / W) values per rank (zero-padded); each rank encodes its whole local
gradient and an all-to-all sends piece j to rank j; rank j decodes the W pieces it received, sums
them in fp32 in rank order and divides by W (the mean of piece j), encodes that mean once more
and an all-gather replicates it; every rank decodes the same bytes, so the replicas agree bit for
bit. That is ZeRO++'s qgZ and Megatron's fp32-accumulating reduce-scatter, plus the all-gather
DDP needs; torch's bf16_compress_hook instead all-reduces bf16 tensors, whose partial sums are
rounded to bf16 at every hop of the ring. Each value is rounded twice here (by its rank, then as
part of the mean), whatever the number of ranks. Under FSDP2 (reduce_scatter_compressed, the
custom reduce-scatter of comm/fsdp.py) the pieces are FSDP's own chunks and each rank keeps its
fp32 mean chunk: no all-gather, one rounding.

The step's compressed layers share one all-to-all and one all-gather of one byte buffer (fp8 has
no gloo dtype): row j of it is, for each layer in layer order, piece j's values then its scales,
each padded to whole 4-byte words (so the scales can be read in place as float32). Per layer and
rank that is ceil(p b / 32) words of values and, for fp8, ceil(p / block_size) scales:

    floats_sent = W (ceil(p b / 32) + [b = 8] ceil(p / block_size))        b = 16 or 8

the float32 words of a dense all-reduce that would cost the same on a ring (an all-to-all moves
what a reduce-scatter does, and the all-gather the same again): half of n for bf16, a quarter
plus the scales for fp8. bytes_sent counts what went into the collectives, as for every reducer:
the all-to-all's W rows (4 floats_sent) and the all-gather's one row (in allgather_bytes). Under
FSDP p is FSDP's chunk (its rows padded to a multiple of W), which bytes_sent counts and
floats_sent, computed from the layer's size alone, does not.

Stochastic rounding (`stochastic_rounding`) rounds up with probability the distance to the
value below, so the rounding is unbiased; its random numbers come from a generator seeded by
(seed, layer, how many times the layer was reduced, rank, which of the two encodings), so every
rank draws its own numbers without communication and a resumed run draws the same ones
(state_dict holds the counts). No error memory: the reducer keeps nothing of the gradient's size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import Reducer
from .config import PrecisionSettings
from .stats import CommStats


@dataclass(frozen=True)
class WireFormat:
    """A low-precision format: its torch dtype, bits, mantissa bits and smallest normal exponent
    (what rounding to it costs), and the largest finite value (None: no scale needed, bf16
    has fp32's exponent range)."""

    name: str
    dtype: torch.dtype
    bits: int
    mantissa: int
    min_exponent: int
    max: float | None

    def unit_roundoff(self, stochastic: bool) -> float:
        """The largest relative error of one rounding of a normal value: half an ulp for round
        to nearest, a whole ulp for stochastic rounding."""
        return 2.0 ** -(self.mantissa + (0 if stochastic else 1))


FORMATS = {
    "bf16": WireFormat("bf16", torch.bfloat16, 16, 7, -126, None),
    "e4m3": WireFormat("e4m3", torch.float8_e4m3fn, 8, 3, -6, 448.0),
    "e5m2": WireFormat("e5m2", torch.float8_e5m2, 8, 2, -14, 57344.0),
}


def _words(values: int, bits: int) -> int:
    """float32 words that hold `values` values of `bits` bits."""
    return -(-values * bits // 32)


def piece_size(numel: int, world_size: int) -> int:
    """Values of a layer each rank reduces (and sends to each rank): ceil(numel / world_size)."""
    return -(-numel // world_size)


def piece_words(p: int, bits: int, block_size: int) -> tuple[int, int]:
    """(value words, scale words) of one piece of p values at `bits` (fp8 has a scale per block)."""
    return _words(p, bits), (-(-p // block_size) if bits == 8 else 0)


def _round_to_bf16_stochastic(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """x rounded to bf16 up or down with probability its distance to the other: bf16 is fp32
    without its low 16 bits, so adding a uniform 16-bit integer to the bits and dropping them
    does it for normal and subnormal values alike (and for either sign: the bits are the
    magnitude)."""
    bits = x.view(torch.int32) + noise
    return bits.bitwise_and_(-65536).view(torch.float32).to(torch.bfloat16)


def _round_to_grid_stochastic(y: torch.Tensor, fmt: WireFormat, noise: torch.Tensor):
    """y (within the format's range) rounded stochastically onto the format's values: the
    spacing at y is 2^(max(e, min_exponent) - mantissa) for |y| in [2^e, 2^(e+1)), built from
    its exponent bits (exact), and floor(y / spacing + u) * spacing is exact in fp32."""
    _, exponent = torch.frexp(y)  # y = m 2^exponent with 0.5 <= |m| < 1: e = exponent - 1
    spacing_exponent = (exponent - 1).clamp_(min=fmt.min_exponent) - fmt.mantissa
    spacing = ((spacing_exponent + 127) << 23).view(torch.float32)
    return torch.floor(y / spacing + noise).mul_(spacing)


def encode(rows: torch.Tensor, fmt: WireFormat, block_size: int,
           noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float32 rows (r, p) as (values (r, p) in fmt.dtype, scales (r, ceil(p / block_size)) in
    float32, or None for bf16). A block's scale is its largest magnitude over the format's max
    (1 for an all-zero block), so its values fill the format's range. `noise`: stochastic
    rounding (int32 in [0, 2^16) for bf16, uniform [0, 1) floats shaped as the padded blocks
    for fp8); None rounds to nearest (even)."""
    if fmt.max is None:
        values = rows.to(fmt.dtype) if noise is None else _round_to_bf16_stochastic(rows, noise)
        return values, None
    r, p = rows.shape
    blocks = -(-p // block_size)
    padded = F.pad(rows, (0, blocks * block_size - p)).view(r, blocks, block_size)
    amax = padded.abs().amax(dim=2)
    scales = torch.where(amax > 0, amax / fmt.max, torch.ones_like(amax))
    scaled = (padded / scales.unsqueeze(2)).clamp_(-fmt.max, fmt.max)
    if noise is not None:
        scaled = _round_to_grid_stochastic(scaled, fmt, noise).clamp_(-fmt.max, fmt.max)
    values = scaled.to(fmt.dtype).view(r, blocks * block_size)[:, :p]
    return values, scales


def decode(values: torch.Tensor, scales: torch.Tensor | None, block_size: int) -> torch.Tensor:
    """encode's inverse: float32 rows (r, p)."""
    rows = values.to(torch.float32)
    if scales is None:
        return rows
    r, p = rows.shape
    blocks = scales.shape[1]
    padded = F.pad(rows, (0, blocks * block_size - p)).view(r, blocks, block_size)
    return padded.mul_(scales.unsqueeze(2)).view(r, blocks * block_size)[:, :p]


class _WireLayout:
    """Where each layer's piece sits in a row of the step's byte buffer (module docstring):
    per layer, (layer, fmt, p, value byte offset, value bytes, scale byte offset, scales).
    `items`: (layer, level, p) in layer order."""

    def __init__(self, items, formats: dict[int, WireFormat], block_size: int):
        self.entries = []
        offset = 0
        for layer, level, p in items:
            value_words, scale_words = piece_words(p, level, block_size)
            self.entries.append((layer, formats[level], p, offset, 4 * value_words,
                                 offset + 4 * value_words, scale_words))
            offset += 4 * (value_words + scale_words)
        self.row_bytes = offset


def _field(rows: torch.Tensor, start: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    """Bytes start:start + length of each row of a (r, row_bytes) uint8 tensor, as `dtype`."""
    return rows[:, start:start + length].view(dtype)


class PrecisionReducer(Reducer):
    name = "precision"
    SETTINGS = PrecisionSettings
    # the dense tensors' all-reduce, the pieces' all-to-all, the mean's all-gather (priced as
    # all-reduces of their input by the cost model: docs/compressors.md)
    STEP_COLLECTIVES = (3, 1)
    REDUCE_SCATTERS = True

    def __init__(self, params: Sequence[torch.Tensor], *, bits: int | None, fp8_format: str,
                 block_size: int, stochastic_rounding: bool, seed: int, group=None):
        """Options as PrecisionSettings (comm/config.py) holds them; build_reducer fills
        defaults."""
        super().__init__(params, group=group, default_level=self._check_level(bits))
        if self.dtype != torch.float32:
            raise ValueError("the precision reducer encodes float32 gradients (its fp32 level is "
                             f"the float32 all-reduce); got {self.dtype} gradients")
        self.formats = {16: FORMATS["bf16"], 8: FORMATS[fp8_format]}
        self.block_size = block_size
        self.stochastic_rounding = stochastic_rounding
        self.seed = seed
        # How many times each layer has been reduced at 16 or 8 bits: with the seed, what its
        # stochastic rounding draws next (state_dict carries it, so a resumed run draws alike).
        self.rounds = [0] * self.num_compressible
        self._layouts: dict[tuple, _WireLayout] = {}

    def _sends_dense(self, layer: int, level: int) -> bool:
        return level == 32

    def _compressed_floats(self, layer: int, level: int) -> int:
        world = self.comm.world_size
        p = piece_size(self.numels[self.tensor_of_layer[layer]], world)
        return world * sum(piece_words(p, level, self.block_size))

    def _layout(self, items: tuple[tuple[int, int, int], ...]) -> _WireLayout:
        if items not in self._layouts:
            if len(self._layouts) > 64:  # level patterns come and go; keep the cache small
                self._layouts.clear()
            self._layouts[items] = _WireLayout(items, self.formats, self.block_size)
        return self._layouts[items]

    def _noise(self, layer: int, fmt: WireFormat, rows: int, p: int, stage: int):
        """Stochastic rounding's random numbers for `rows` pieces of p values of `layer` (None
        when rounding to nearest); stage 0 is a rank's own gradient, 1 the mean it reduced."""
        if not self.stochastic_rounding:
            return None
        key = repr((self.seed, layer, self.rounds[layer], self.comm.rank, stage)).encode()
        seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
        generator = torch.Generator(device=self.device).manual_seed(seed)
        if fmt.max is None:
            return torch.randint(0, 1 << 16, (rows, p), generator=generator, dtype=torch.int32,
                                 device=self.device)
        blocks = -(-p // self.block_size)
        return torch.rand((rows, blocks, self.block_size), generator=generator,
                          dtype=torch.float32, device=self.device)

    def _write(self, rows: torch.Tensor, entry, values: torch.Tensor, scales) -> None:
        _, fmt, p, value_at, value_bytes, scale_at, scale_words = entry
        _field(rows, value_at, value_bytes, fmt.dtype)[:, :p].copy_(values)
        if scales is not None:
            _field(rows, scale_at, 4 * scale_words, torch.float32).copy_(scales)

    def _read(self, rows: torch.Tensor, entry) -> torch.Tensor:
        _, fmt, p, value_at, value_bytes, scale_at, scale_words = entry
        values = _field(rows, value_at, value_bytes, fmt.dtype)[:, :p]
        scales = _field(rows, scale_at, 4 * scale_words, torch.float32) if scale_words else None
        return decode(values, scales, self.block_size)

    def _scatter_steps(self, pieces: list[tuple[int, torch.Tensor]], stats: CommStats):
        """The reduce-scatter half: `pieces` are (layer, (W, p) rows of its local gradient), in
        layer order; row j goes to rank j. Yields once with the all-to-all's handles (when it
        sent anything), then returns (layout, this rank's fp32 mean piece of each layer)."""
        layout = self._layout(tuple((layer, self.levels[layer], rows.shape[1])
                                    for layer, rows in pieces))
        world = self.comm.world_size
        # zeros: the padding bytes are sent too, and the same on every run
        send = torch.zeros((world, layout.row_bytes), dtype=torch.uint8, device=self.device)
        for (layer, rows), entry in zip(pieces, layout.entries):
            fmt, p = entry[1], entry[2]
            self._write(send, entry, *encode(rows, fmt, self.block_size,
                                             self._noise(layer, fmt, world, p, 0)))
        received, handles = self.comm.all_to_all_async(send, stats)
        if handles:
            yield handles
        means = []
        for entry in layout.entries:
            parts = self._read(received, entry)  # row r: rank r's piece of this rank's part
            total = parts[0].clone()
            for part in parts[1:]:  # fp32, in rank order
                total.add_(part)
            means.append(total.div_(world))
        return layout, means

    def _compressed_steps(self, items: list[tuple[int, torch.Tensor]], stats: CommStats,
                          carried: Sequence[torch.Tensor] = ()):
        """All-to-all of the pieces, fp32 means, then the all-gather of the re-encoded means."""
        items = sorted(items, key=lambda item: item[0])
        world, rank = self.comm.world_size, self.comm.rank
        pieces = []
        for layer, grad in items:
            flat = grad.view(-1)
            p = piece_size(flat.numel(), world)
            pieces.append((layer, F.pad(flat, (0, world * p - flat.numel())).view(world, p)))
        scatter = self._scatter_steps(pieces, stats)
        try:
            while True:
                yield next(scatter), False
        except StopIteration as done:
            layout, means = done.value

        gathered = torch.zeros(world * layout.row_bytes, dtype=torch.uint8, device=self.device)
        mine = gathered.view(world, layout.row_bytes)[rank:rank + 1]
        for (layer, _), entry, mean in zip(items, layout.entries, means):
            self._write(mine, entry, *encode(mean.unsqueeze(0), entry[1], self.block_size,
                                             self._noise(layer, entry[1], 1, entry[2], 1)))
        rows, handles = self.comm.all_gather_async(mine.view(-1), stats, out=gathered)
        yield handles, True

        for (layer, grad), entry in zip(items, layout.entries):
            flat = grad.view(-1)
            flat.copy_(self._read(rows, entry).reshape(-1)[:flat.numel()])
            self.rounds[layer] += 1

    def reduce_scatter_compressed(self, pieces: list[tuple[int, torch.Tensor]],
                                  stats: CommStats) -> list[torch.Tensor]:
        """FSDP2's reduce-scatter of the compressed layers (comm/fsdp.py): `pieces` are
        (layer, (W, p) rows of the layer's padded local gradient, row j FSDP's chunk for rank
        j); returns this rank's fp32 mean chunk of each, in the order given. ZeRO++'s qgZ: the
        all-to-all and the fp32 sum only, no all-gather and no second rounding, so each value
        is rounded once (by the rank that sent it)."""
        order = sorted(range(len(pieces)), key=lambda i: pieces[i][0])
        scatter = self._scatter_steps([pieces[i] for i in order], stats)
        try:
            while True:
                for work in next(scatter):
                    work.wait()
        except StopIteration as done:
            _, means = done.value
        for layer, _ in pieces:
            self.rounds[layer] += 1
        out = [None] * len(pieces)
        for i, mean in zip(order, means):
            out[i] = mean
        return out

    # ---- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "rounds": list(self.rounds), "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.rounds = list(state["rounds"])
        self.seed = state["seed"]


__all__ = ["PrecisionReducer", "FORMATS", "WireFormat", "encode", "decode", "piece_size",
           "piece_words"]
