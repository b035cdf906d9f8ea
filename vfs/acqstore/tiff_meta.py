"""Plane order, and the ImageJ, OME-XML or shaped description telling readers axes and sizes."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import quoteattr

import numpy as np

from vfs.acqstore.ngff import Axis
from vfs.errors import UnsupportedFormatError

# ImageJ stores 8- and 16-bit unsigned and 32-bit float natively; everything else it rescales.
IMAGEJ_DTYPES = frozenset({"|u1", "<u2", "<f4"})
OME_TYPES = {
    "|i1": "int8",
    "<i2": "int16",
    "<i4": "int32",
    "|u1": "uint8",
    "<u2": "uint16",
    "<u4": "uint32",
    "<f4": "float",
    "<f8": "double",
}
_IMAGEJ_UNITS = {"micrometer": "micron", "nanometer": "nm", "millimeter": "mm", "centimeter": "cm"}
_OME_LENGTH = {
    "angstrom": "Å",
    "nanometer": "nm",
    "micrometer": "µm",
    "millimeter": "mm",
    "centimeter": "cm",
    "meter": "m",
}
_OME_TIME = {
    "second": "s",
    "millisecond": "ms",
    "microsecond": "µs",
    "nanosecond": "ns",
    "minute": "min",
}
_BY_TYPE = {"time": "T", "channel": "C", "space": "Z"}
_BY_NAME = {"t": "T", "time": "T", "c": "C", "ch": "C", "channel": "C", "z": "Z"}
_MAX_U32 = 2**32 - 1
# Channels the OME-XML lists one <Channel> element each (the schema lets Pixels have none).
# The count comes from a `.zarray` of a few hundred bytes: 10,000,000 channels made a 450 MB
# description, 2 GB of the daemon when the collection was listed and ~1 GB per open handle.
MAX_OME_CHANNELS = 4096


@dataclass(frozen=True)
class PlaneMeta:
    flavor: str  # "imagej", "ome" or "shaped"
    page_axes: tuple[int, ...]  # NGFF axis indices enumerated by pages, outermost first
    page_shape: tuple[int, ...]
    description: str


def describe_planes(
    axes: Sequence[Axis],
    shape: Sequence[int],
    dtype: np.dtype,
    scale: Sequence[float],
    name: str = "",
    flavor: str = "auto",
) -> PlaneMeta:
    """Choose the page order (ImageJ's: channel fastest, then z, then time) and the description.

    ImageJ hyperstack metadata where ImageJ can hold the dtype, OME-XML for the other OME pixel
    types, and tifffile's shaped JSON for the rest (64-bit integers, float16) or for more than
    three non-plane axes, which neither ImageJ nor OME can name.
    """
    lead = len(shape) - 2
    roles = _roles(axes[:lead])
    if roles is None:
        page_axes = tuple(range(lead))
    else:
        page_axes = tuple(a for r in "TZC" for a, role in roles.items() if role == r)
    page_shape = tuple(int(shape[a]) for a in page_axes)
    if flavor == "auto":
        flavor = "shaped"
        if roles is not None and dtype.str in IMAGEJ_DTYPES:
            flavor = "imagej"
        elif roles is not None and dtype.str in OME_TYPES:
            flavor = "ome"
    if flavor != "shaped" and (
        roles is None or dtype.str not in (IMAGEJ_DTYPES if flavor == "imagej" else OME_TYPES)
    ):
        raise UnsupportedFormatError(f"{flavor} metadata cannot describe {dtype} {tuple(shape)}")
    by_role = {} if roles is None else {role: a for a, role in roles.items()}
    sizes = {role: int(shape[a]) for role, a in by_role.items()}
    n_pages = int(np.prod(page_shape, dtype=np.int64))
    if flavor == "imagej":
        text = _imagej(axes, scale, by_role, sizes, n_pages)
    elif flavor == "ome":
        text = _ome(axes, shape, scale, by_role, sizes, OME_TYPES[dtype.str], name, n_pages)
    else:
        text = json.dumps({"shape": [*page_shape, int(shape[-2]), int(shape[-1])]})
    return PlaneMeta(flavor, page_axes, page_shape, text)


def resolution(pixel_size: float) -> tuple[int, int]:
    """Pixels per unit as a TIFF RATIONAL, the inverse of the NGFF scale."""
    if not math.isfinite(pixel_size) or pixel_size <= 0:
        return 1, 1
    value = 1.0 / pixel_size
    den = max(1, min(1_000_000, int(_MAX_U32 // max(value, 1.0))))
    num = round(value * den)
    if num == 0:
        return 1, min(_MAX_U32, round(1 / value))
    g = math.gcd(num, den)
    return min(num // g, _MAX_U32), den // g


def _roles(axes: Sequence[Axis]) -> dict[int, str] | None:
    """Map each non-plane axis to T, Z or C: by NGFF type, then by name, then whatever is free."""
    if len(axes) > 3:
        return None
    roles: dict[int, str] = {}
    for i, axis in enumerate(axes):
        want = _BY_TYPE.get(axis.type or "") or _BY_NAME.get(axis.name.lower())
        if want and want not in roles.values():
            roles[i] = want
    for i in range(len(axes)):
        if i not in roles:
            roles[i] = next(r for r in "CZT" if r not in roles.values())
    return roles


def _num(value: float) -> str:
    return repr(float(value))


def _imagej(
    axes: Sequence[Axis],
    scale: Sequence[float],
    by_role: dict[str, int],
    sizes: dict[str, int],
    n: int,
) -> str:
    lines = ["ImageJ=1.11a", f"images={n}"]
    for role, key in (("C", "channels"), ("Z", "slices"), ("T", "frames")):
        if sizes.get(role, 1) > 1:
            lines.append(f"{key}={sizes[role]}")
    lines += ["hyperstack=true", "mode=grayscale"]
    unit = axes[-1].unit
    if unit:
        lines.append(f"unit={_IMAGEJ_UNITS.get(unit, unit)}")
    if "Z" in by_role:
        lines.append(f"spacing={_num(scale[by_role['Z']])}")
    if "T" in by_role:
        lines.append(f"finterval={_num(scale[by_role['T']])}")
        tunit = axes[by_role["T"]].unit
        if tunit:
            lines.append(f"tunit={_OME_TIME.get(tunit, tunit)}")
    lines.append("loop=false")
    return "\n".join(lines) + "\n"


def _ome(
    axes: Sequence[Axis],
    shape: Sequence[int],
    scale: Sequence[float],
    by_role: dict[str, int],
    sizes: dict[str, int],
    pixel_type: str,
    name: str,
    n: int,
) -> str:
    attrs = {
        "ID": "Pixels:0",
        "DimensionOrder": "XYCZT",
        "Type": pixel_type,
        "SizeX": str(shape[-1]),
        "SizeY": str(shape[-2]),
        "SizeC": str(sizes.get("C", 1)),
        "SizeZ": str(sizes.get("Z", 1)),
        "SizeT": str(sizes.get("T", 1)),
        "BigEndian": "false",
        "Interleaved": "false",
    }
    for key, index in (("X", len(shape) - 1), ("Y", len(shape) - 2), ("Z", by_role.get("Z"))):
        if index is not None and axes[index].unit in _OME_LENGTH and scale[index] > 0:
            attrs[f"PhysicalSize{key}"] = _num(scale[index])
            attrs[f"PhysicalSize{key}Unit"] = _OME_LENGTH[axes[index].unit or ""]
    t = by_role.get("T")
    if t is not None and axes[t].unit in _OME_TIME:
        attrs["TimeIncrement"] = _num(scale[t])
        attrs["TimeIncrementUnit"] = _OME_TIME[axes[t].unit or ""]
    count = sizes.get("C", 1)
    channels = "".join(
        f'<Channel ID="Channel:0:{c}" SamplesPerPixel="1"/>' for c in range(count)
    ) if count <= MAX_OME_CHANNELS else ""  # fmt: skip
    pixels = " ".join(f"{k}={quoteattr(v)}" for k, v in attrs.items())
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06" Creator="decant-mount">'
        f'<Image ID="Image:0" Name={quoteattr(name)}><Pixels {pixels}>{channels}'
        f'<TiffData IFD="0" PlaneCount="{n}"/></Pixels></Image></OME>'
    )
