"""OME-Zarr (NGFF) 0.5 metadata in its 0.4 form, for the v2 view, and back.

Pure. OME-Zarr 0.5 lives in zarr v3: a node's OME metadata is one object under
the attribute `ome`, whose `version` ("0.5") is the only version it states.
OME-NGFF 0.4 lives in zarr v2: the same objects are top-level keys of
`.zattrs`, and several carry their own version. The objects are the same in
both (the 0.5 schemas are the 0.4 ones moved under `ome`), so the mapping is:

- `multiscales`, `omero`, `labels`, `image-label`, `plate`, `well`,
  `bioformats2raw.layout` and `series` (the bioformats2raw `OME` group) move
  between `ome` and the top level, as they are;
- each `multiscales` item, `image-label`, `plate` and `well` carries
  `"version": "0.4"` in 0.4 and no version in 0.5; `omero` and `labels` carry
  none in either (the 0.4 omero example's "version" is dropped on the way
  back when it says "0.4");
- the other attributes of the node sit beside the OME keys in both.

A written 0.4 object of another version (a "0.3" or "0.5" `multiscales`
item, say) is refused with InvalidWrite: it would need another translation.

What 0.4 cannot say is left out of the 0.4 form and named (`v04_attributes`):
a key under `ome` that 0.4 does not have, an attribute beside `ome` whose name
is an OME key (a 0.4 reader would take it for OME metadata), and a version
inside an object (0.5 has none there) other than the document's own (which
ome-zarr-models writes into `plate`, and which 0.4 says as "0.4"). A 0.4 document written back
(`v05_attributes`) takes from the node's current attributes what the 0.4 form
left out, so a 0.4 tool's read-modify-write loses nothing. What else 0.5
requires, the level arrays' `dimension_names`, is `dimension_names`.

Limits: the functions see one node's attributes, not where it is. A written
document counts as 0.4 OME when it has an OME key; `labels` and `series` are
common words, so there they count only as a list of paths, and only on nodes
without OME 0.5 metadata. Nothing is validated beyond what the mapping needs:
an invalid 0.4 document becomes an equally invalid 0.5 one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from typing import Any

from shardfs.primitives.errors import InvalidWrite

#: The OME objects, under `ome` in 0.5 and at the top level of `.zattrs` in 0.4.
OME_KEYS = frozenset(
    {
        "multiscales",
        "omero",
        "labels",
        "image-label",
        "plate",
        "well",
        "bioformats2raw.layout",
        "series",
    }
)
#: OME keys that are also common attribute names: OME only as a list of paths.
PATH_LISTS = frozenset({"labels", "series"})
#: The OME keys of an image group (a label image is one too).
IMAGE_KEYS = frozenset({"multiscales", "omero", "image-label"})
#: The objects (besides each `multiscales` item) that carry their own version in 0.4.
VERSIONED = ("image-label", "plate", "well")
V04, V05 = "0.4", "0.5"


def _ome(attributes: Any) -> dict[str, Any] | None:
    """The `ome` object of 0.5 attributes, or None for anything else."""
    ome = attributes.get("ome") if isinstance(attributes, dict) else None
    version = ome.get("version") if isinstance(ome, dict) else None
    if isinstance(version, str) and version.startswith(V05):
        return ome
    return None


def is_v05(attributes: Any) -> bool:
    """Whether a node's attributes hold OME-Zarr 0.5 metadata."""
    return _ome(attributes) is not None


def _items(container: Any, key: str) -> list[dict[str, Any]]:
    """The objects of the list at `key`, skipping what is not an object (metadata may be bad)."""
    value = container.get(key) if isinstance(container, dict) else None
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _versioned(objects: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The objects that state their own version in 0.4, with where they are."""
    items = objects.get("multiscales")
    if isinstance(items, list):
        for i, item in enumerate(items):
            if isinstance(item, dict):
                yield f"multiscales[{i}]", item
    for key in VERSIONED:
        if isinstance(objects.get(key), dict):
            yield key, objects[key]


def v04_attributes(attributes: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The `.zattrs` of a v3 node in the v2 view, and what 0.4 could not show of it.

    Attributes without OME 0.5 metadata are shown as they are.
    """
    ome = _ome(attributes)
    if ome is None:
        return copy.deepcopy(attributes), []
    shown: dict[str, Any] = {}
    dropped = []
    for key, value in attributes.items():
        if key in OME_KEYS:
            dropped.append(f"attribute {key!r}: a 0.4 reader would take it for OME metadata")
        elif key != "ome":
            shown[key] = copy.deepcopy(value)
    for key, value in ome.items():
        if key in OME_KEYS:
            shown[key] = copy.deepcopy(value)
        elif key != "version":
            dropped.append(f"ome.{key}: 0.4 has no such key")
    for where, obj in _versioned(shown):
        version = obj.get("version", V04)
        # the document's own version restated inside an object is what 0.4 says as "0.4"
        if version not in (V04, ome["version"]):
            dropped.append(
                f"ome.{where}.version {json.dumps(version)}: 0.4 has {json.dumps(V04)} there"
            )
        obj["version"] = V04
    return shown, dropped


def _holds_v04(written: dict[str, Any]) -> bool:
    """Whether a written `.zattrs` (of a node without OME 0.5) holds 0.4 OME objects."""
    return any(
        key in written
        and (
            key not in PATH_LISTS
            or (isinstance(written[key], list) and all(isinstance(p, str) for p in written[key]))
        )
        for key in OME_KEYS
    )


def _v05_form(written: dict[str, Any]) -> dict[str, Any]:
    """A 0.4 document with OME keys as 0.5 attributes; InvalidWrite if it is not 0.4."""
    if "ome" in written:
        raise InvalidWrite(
            "the written .zattrs holds both 0.4 OME metadata and an 'ome' attribute, "
            "where OME-Zarr 0.5 keeps its metadata"
        )
    ome: dict[str, Any] = {"version": V05}
    attributes: dict[str, Any] = {}
    for key, value in written.items():
        (ome if key in OME_KEYS else attributes)[key] = copy.deepcopy(value)
    for where, obj in _versioned(ome):
        version = obj.pop("version", V04)
        if version != V04:
            raise InvalidWrite(
                f"{where} in the written .zattrs is OME-NGFF {json.dumps(version)}: the v2 view "
                f"shows OME-Zarr {V05} as {V04} and takes {V04} only"
            )
    omero = ome.get("omero")
    if isinstance(omero, dict) and omero.get("version") == V04:
        del omero["version"]
    return {"ome": ome, **attributes}


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON (so 1, 1.0 and true differ)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _merge(source: Any, old: Any, new: Any) -> Any:
    """`source` changed as `old` became `new`: what the writer did not change, and what the
    0.4 form did not show (the parts of `source` that `old` lacks), stay as in `source`."""
    if _same(old, new):
        return source
    if isinstance(source, dict) and isinstance(old, dict) and isinstance(new, dict):
        merged = {}
        for key, value in source.items():
            if key in new:
                merged[key] = _merge(value, old[key], new[key]) if key in old else new[key]
            elif key not in old:
                merged[key] = value
        for key, value in new.items():
            merged.setdefault(key, value)
        return merged
    if (
        isinstance(source, list)
        and isinstance(old, list)
        and isinstance(new, list)
        and len(source) == len(old) == len(new)
    ):
        return [_merge(s, o, n) for s, o, n in zip(source, old, new, strict=True)]
    return new


def v05_attributes(written: dict[str, Any], source: dict[str, Any] | None) -> dict[str, Any]:
    """The v3 attributes of a node whose `.zattrs` a 0.4 tool wrote through the v2 view.

    `source` is the node's current attributes (None for a new node). If it holds OME 0.5,
    what its 0.4 form left out is kept (a written document without OME keys removes the
    OME objects, not the attributes the 0.4 form hid). InvalidWrite if the written OME
    objects are not 0.4.
    """
    if source is None or _ome(source) is None:
        return _v05_form(written) if _holds_v04(written) else copy.deepcopy(written)
    shown = v04_attributes(source)[0]
    # kept as it is: a document that drops the OME keys shown, or a 0.5 one written whole
    as_is = not OME_KEYS & written.keys() and (bool(OME_KEYS & shown.keys()) or "ome" in written)
    new = copy.deepcopy(written) if as_is else _v05_form(written)
    return copy.deepcopy(_merge(source, _v05_form(shown), new))


def dimension_names(attributes: dict[str, Any]) -> dict[str, list[str]]:
    """The `dimension_names` that 0.5 requires of each level array of a multiscales group
    (the axes names), by dataset path; a 0.4 writer's arrays have none."""
    names: dict[str, list[str]] = {}
    for multiscale in _items(_ome(attributes), "multiscales"):
        given = [axis.get("name") for axis in _items(multiscale, "axes")]
        axes = [name for name in given if isinstance(name, str)]
        if len(axes) != len(given):
            continue
        for dataset in _items(multiscale, "datasets"):
            if isinstance(dataset.get("path"), str):
                names.setdefault(dataset["path"], list(axes))
    return names


# -- shardfs info ----------------------------------------------------------------------


def _join(path: str, sub: str) -> str:
    return f"{path}/{sub}" if path else sub


def _display(path: str) -> str:
    return "/" + path


def _number(value: Any) -> str:
    return (
        f"{value:g}"
        if isinstance(value, int | float) and not isinstance(value, bool)
        else str(value)
    )


def _count(n: Any, noun: str, plural: str = "") -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _vector(values: list[Any]) -> str:
    return "[" + ", ".join(_number(v) for v in values) + "]"


def _transforms(transforms: list[dict[str, Any]]) -> str:
    """Scale and translation as given, one after the other."""
    parts = []
    for t in transforms:
        kind = t.get("type")
        value = t.get(kind) if isinstance(kind, str) else None
        given = _vector(value) if isinstance(value, list) else f"from {t.get('path')!r}"
        parts.append(f"{kind} {given}")
    return ", ".join(parts)


def _composed(transforms: list[dict[str, Any]], ndim: int) -> str:
    """The scale and translation that `transforms` (applied in order) come to, as physical
    units per pixel; as given if one is stored in an array or has the wrong length."""
    if not transforms:
        return "no coordinateTransformations"
    scale, translation = [1.0] * ndim, [0.0] * ndim
    for t in transforms:
        kind = t.get("type")
        value = t.get(kind) if kind in ("scale", "translation") else None
        if not (
            isinstance(value, list)
            and len(value) == ndim
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        ):
            return _transforms(transforms)
        if t["type"] == "scale":
            scale = [s * v for s, v in zip(scale, value, strict=True)]
            translation = [o * v for o, v in zip(translation, value, strict=True)]
        else:
            translation = [o + v for o, v in zip(translation, value, strict=True)]
    moved = any(t.get("type") == "translation" for t in transforms)
    return f"scale {_vector(scale)}" + (f", translation {_vector(translation)}" if moved else "")


def _axis(axis: dict[str, Any]) -> str:
    kind = [str(axis[k]) for k in ("type", "unit") if axis.get(k) is not None]
    return f"{axis.get('name')}" + (f" ({', '.join(kind)})" if kind else "")


def _array(node: Any) -> str:
    if not isinstance(node, dict) or node.get("node_type") != "array":
        return "no array"
    shape = "x".join(str(n) for n in node.get("shape") or [])
    return f"shape {shape or '()'} {node.get('data_type')}"


def _channel(i: int, channel: dict[str, Any]) -> str:
    window = channel.get("window") if isinstance(channel.get("window"), dict) else {}
    line = f"  channel {i}: {channel.get('label')!r}, color {channel.get('color')}"
    if window:
        line += (
            f", window {_number(window.get('start'))}..{_number(window.get('end'))}"
            f" of {_number(window.get('min'))}..{_number(window.get('max'))}"
        )
    return line + (", inactive" if channel.get("active") is False else "")


def _image(path: str, ome: dict[str, Any], nodes: Mapping[str, dict[str, Any]]) -> list[str]:
    """An image or label image: its multiscales, the image-label and the omero channels."""
    label = ome.get("image-label")
    what = f"{'label image' if isinstance(label, dict) else 'image'} {_display(path)}"
    facts = []
    if isinstance(label, dict):
        for key, noun, plural in (
            ("colors", "color", ""),
            ("properties", "property", "properties"),
        ):
            if isinstance(label.get(key), list):
                facts.append(_count(len(label[key]), noun, plural))
        source = label.get("source")
        if isinstance(source, dict) and "image" in source:
            facts.append(f"source {source['image']}")
    multiscales = _items(ome, "multiscales")
    lines = [] if multiscales else [f"{what}: {', '.join([*facts, 'no multiscales'])}"]
    for i, multiscale in enumerate(multiscales):
        datasets = _items(multiscale, "datasets")
        axes = _items(multiscale, "axes")
        head = [repr(multiscale["name"])] if multiscale.get("name") is not None else []
        head.append(_count(len(datasets), "level"))
        if multiscale.get("type") is not None:
            head.append(f"type {multiscale['type']!r}")
        number = f" [{i}]" if len(multiscales) > 1 else ""
        lines.append(f"{what}{number}: {', '.join(head + (facts if i == 0 else []))}")
        lines.append(f"  axes: {', '.join(_axis(a) for a in axes)}")
        common = _items(multiscale, "coordinateTransformations")
        if common:
            lines.append(f"  every level, after its own: {_transforms(common)}")
        for j, dataset in enumerate(datasets):
            level = _join(path, str(dataset.get("path")))
            transforms = _items(dataset, "coordinateTransformations") + common
            lines.append(
                f"  level {j} ({_display(level)}): {_array(nodes.get(level))}, "
                f"{_composed(transforms, len(axes))}"
            )
    omero = ome.get("omero")
    lines += [_channel(i, c) for i, c in enumerate(_items(omero, "channels"))]
    return lines


def _plate(
    path: str, plate: dict[str, Any], nodes: Mapping[str, dict[str, Any]], seen: set[str]
) -> list[str]:
    """The plate layout, its acquisitions and its wells' fields (whose groups go to `seen`)."""
    wells = _items(plate, "wells")
    acquisitions = _items(plate, "acquisitions")
    facts = [repr(plate["name"])] if plate.get("name") is not None else []
    facts += [
        f"{_count(len(_items(plate, 'rows')), 'row')} x "
        f"{_count(len(_items(plate, 'columns')), 'column')}",
        _count(len(wells), "well"),
    ]
    if plate.get("field_count") is not None:
        facts.append(f"at most {_count(plate['field_count'], 'field')} per well")
    if acquisitions:
        facts.append(_count(len(acquisitions), "acquisition"))
    lines = [f"plate {_display(path)}: {', '.join(facts)}"]
    for a in acquisitions:
        most = a.get("maximumfieldcount")
        lines.append(
            f"  acquisition {a.get('id')}: {a.get('name')!r}"
            + (f", at most {_count(most, 'field')}" if most is not None else "")
        )
    for well in wells:
        where = _join(path, str(well.get("path")))
        seen.add(where)
        meta = _ome((nodes.get(where) or {}).get("attributes"))
        if meta is None or not isinstance(meta.get("well"), dict):
            lines.append(f"  well {well.get('path')}: no well group")
            continue
        lines.append(f"  well {well.get('path')}: {_fields(meta['well'])}")
    return lines


def _fields(well: dict[str, Any]) -> str:
    images = _items(well, "images")
    acquisitions = sorted({str(i["acquisition"]) for i in images if "acquisition" in i})
    return _count(len(images), "field") + (
        f", acquisitions {', '.join(acquisitions)}" if acquisitions else ""
    )


def _bioformats2raw(
    path: str, ome: dict[str, Any], nodes: Mapping[str, dict[str, Any]], seen: set[str]
) -> str:
    """Where the images of a bioformats2raw layout are: its `OME` group's series, the plate,
    or numbered groups (the three ways the spec gives, in that order)."""
    group = _join(path, "OME")
    series = (_ome((nodes.get(group) or {}).get("attributes")) or {}).get("series")
    if isinstance(series, list):
        seen.add(group)
        images = f"series {', '.join(map(str, series))} (from {_display(group)})"
    elif "plate" in ome:
        images = "the plate's images"
    else:
        numbered: list[str] = []
        while _join(path, str(len(numbered))) in nodes:
            numbered.append(str(len(numbered)))
        images = f"images {', '.join(numbered) or 'none'}"
    return f"bioformats2raw layout {ome['bioformats2raw.layout']} {_display(path)}: {images}"


def describe(nodes: Mapping[str, dict[str, Any]]) -> list[str]:
    """The OME-Zarr 0.5 structure of a hierarchy (its `zarr.json` documents by node path, ""
    for the root) as text lines for `shardfs info`; [] if it has no OME metadata.

    Level scales and translations are in the axes' units, the multiscale's own
    coordinateTransformations applied; the last lines name what the v2 view leaves out.
    """
    lines: list[str] = []
    left_out: list[str] = []
    seen: set[str] = set()  # wells and OME groups already told by their plate or root
    for path in sorted(nodes):
        attributes = nodes[path].get("attributes")
        ome = _ome(attributes)
        if ome is None:
            continue
        if "bioformats2raw.layout" in ome:
            lines.append(_bioformats2raw(path, ome, nodes, seen))
        if IMAGE_KEYS & ome.keys():
            lines += _image(path, ome, nodes)
        if isinstance(ome.get("labels"), list):
            lines.append(f"labels {_display(path)}: {', '.join(map(str, ome['labels']))}")
        if isinstance(ome.get("plate"), dict):
            lines += _plate(path, ome["plate"], nodes, seen)
        if isinstance(ome.get("well"), dict) and path not in seen:
            lines.append(f"well {_display(path)}: {_fields(ome['well'])}")
        if isinstance(ome.get("series"), list) and path not in seen:
            lines.append(f"series {_display(path)}: {', '.join(map(str, ome['series']))}")
        left_out += [
            f"the v2 view of {_display(path)} leaves out {d}"
            for d in v04_attributes(nodes[path]["attributes"])[1]
        ]
    return lines + left_out
