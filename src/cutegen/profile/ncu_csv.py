"""Read Nsight Compute CSV output into per-launch metric values in base units.

Two layouts are understood, found by their header:

* the raw page (`ncu --csv --page raw`): a header row of column names (identity columns such as
  "ID" and "Kernel Name", then one column per metric), a second row holding each column's unit
  (empty for identity columns), then one row per profiled kernel launch;
* the details page (`ncu --csv`, the default): one row per (launch, metric) with "Metric Name",
  "Metric Unit" and "Metric Value" columns.

Units are where summaries go wrong: with ncu's default `--print-units auto` a byte count may come as
"Kbyte", "Mbyte" or "Gbyte" and a duration as "nsecond", "usecond" or "msecond", and the prefix is
decimal (ncu prints a 64 KiB shared-memory carveout as "65.54 Kbyte"). Every numeric value is
therefore scaled by its own column's (or row's) unit into bytes, seconds, hertz... (`to_base`), and
the summary never assumes a unit. Numbers may carry thousands separators ("1,048,576"); ncu is run
with LC_ALL=C so the decimal mark is a point.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

# SI prefixes as ncu prints them (decimal, also for bytes), and the binary ones other tools use.
_PREFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
# Base units that take a prefix, and short spellings of prefixed units.
_BASES = ("byte", "second", "hz", "cycle", "inst", "sector", "request", "warp", "thread", "block")
_ALIASES = {"ns": "nsecond", "us": "usecond", "ms": "msecond", "s": "second", "sec": "second",
            "B": "byte", "KB": "Kbyte", "MB": "Mbyte", "GB": "Gbyte", "TB": "Tbyte",
            "KiB": "Kibyte", "MiB": "Mibyte", "GiB": "Gibyte", "TiB": "Tibyte", "bytes": "byte",
            "GHz": "Ghz", "MHz": "Mhz", "kHz": "Khz", "Hz": "hz"}
_PLAIN_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
_MISSING = ("", "n/a", "na", "-", "nan")  # printed for a metric with no value
_GROUPED_NUMBER = re.compile(r"^[-+]?\d{1,3}(,\d{3})+(\.\d+)?$")


class NcuCsvError(ValueError):
    """The text is not Nsight Compute CSV output (no header row found)."""


@dataclass
class Launch:
    """One profiled kernel launch: its identity and its metrics.

    `values` maps a metric name to its value in base units (a float) or, for non-numeric metrics
    (a device name), the text as printed; `units` maps it to the base unit ("byte", "second", "%").
    """

    launch_id: int
    kernel_name: str
    block_size: str = ""
    grid_size: str = ""
    values: dict[str, float | str] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)

    def number(self, *names: str) -> float | None:
        """The first of `names` that was measured as a number, else None."""
        for name in names:
            value = self.values.get(name)
            if isinstance(value, float):
                return value
        return None

    def text(self, name: str) -> str | None:
        value = self.values.get(name)
        return value if isinstance(value, str) else None


def _split_prefix(part: str) -> tuple[float, str]:
    """('Mbyte') -> (1e6, 'byte'); a part with no known base is returned unscaled."""
    part = _ALIASES.get(part, part)
    for base in _BASES:
        if part.endswith(base):
            prefix = part[: -len(base)]
            if prefix in _BINARY:
                return _BINARY[prefix], base
            if prefix in _PREFIX:
                return _PREFIX[prefix], base
    return 1.0, part


def unit_scale(unit: str) -> tuple[float, str]:
    """The factor that turns a value printed in `unit` into base units, and the base unit.

    "usecond" -> (1e-6, "second"); "Gbyte/second" -> (1e9, "byte/second"); "byte/usecond" ->
    (1e6, "byte/second"); "%" -> (1.0, "%"); "" -> (1.0, "").
    """
    unit = unit.strip()
    if not unit:
        return 1.0, ""
    numerator, _, denominator = unit.partition("/")
    scale, base = _split_prefix(numerator)
    if denominator:
        den_scale, den_base = _split_prefix(denominator)
        return scale / den_scale, f"{base}/{den_base}"
    return scale, base


def parse_number(text: str) -> float | None:
    """A float from ncu's printed value: "1,048,576" and "4.0e-05" are numbers; "n/a", "" and
    "(256, 1, 1)" are not (None)."""
    text = text.strip().strip('"')
    if _GROUPED_NUMBER.match(text):
        text = text.replace(",", "")
    if _PLAIN_NUMBER.match(text):
        return float(text)
    return None


def to_base(text: str, unit: str) -> tuple[float | str | None, str]:
    """A printed value and its unit -> (value in base units, base unit); text stays text."""
    scale, base = unit_scale(unit)
    number = parse_number(text)
    if number is not None:
        return number * scale, base
    text = text.strip()
    return (None if text.lower() in _MISSING else text), base


def _rows(text: str) -> tuple[list[str], list[list[str]]]:
    """The header row and the rows after it; lines before the header (==PROF== messages, the
    application's own output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"') or line.startswith("ID,")), None)
    if start is None:
        raise NcuCsvError("no Nsight Compute CSV header (a row starting with \"ID\") in the output")
    table = [row for row in csv.reader(io.StringIO("\n".join(lines[start:]))) if row]
    return table[0], table[1:]


def _launch_id(text: str) -> int:
    number = parse_number(text)
    return int(number) if number is not None else -1


def parse_raw_page(header: list[str], rows: list[list[str]]) -> list[Launch]:
    """The raw page: row 0 holds units, each later row is one launch."""
    if not rows:
        return []
    column = {name: i for i, name in reversed(list(enumerate(header)))}  # first occurrence wins
    has_units = not rows[0][column["ID"]].strip()  # the units row leaves the identity columns empty
    units, data = (rows[0], rows[1:]) if has_units else ([""] * len(header), rows)
    launches = []
    for row in data:
        if len(row) < len(header) or not row[column["ID"]].strip():
            continue  # a truncated line (a crash mid-write) or another units row
        launch = Launch(_launch_id(row[column["ID"]]), row[column.get("Kernel Name", 0)],
                        row[column["Block Size"]] if "Block Size" in column else "",
                        row[column["Grid Size"]] if "Grid Size" in column else "")
        for name, i in column.items():
            if "__" not in name:
                continue
            value, base = to_base(row[i], units[i] if i < len(units) else "")
            if value is not None:
                launch.values[name], launch.units[name] = value, base
        launches.append(launch)
    return launches


def parse_details_page(header: list[str], rows: list[list[str]]) -> list[Launch]:
    """The details page: one (launch, metric, unit, value) per row."""
    column = {name: i for i, name in reversed(list(enumerate(header)))}
    by_id: dict[int, Launch] = {}
    for row in rows:
        if len(row) < len(header):
            continue
        launch_id = _launch_id(row[column["ID"]])
        launch = by_id.setdefault(launch_id, Launch(
            launch_id, row[column["Kernel Name"]], row[column["Block Size"]] if "Block Size" in column else "",
            row[column["Grid Size"]] if "Grid Size" in column else ""))
        name = row[column["Metric Name"]].strip()
        if not name:
            continue
        value, base = to_base(row[column["Metric Value"]], row[column["Metric Unit"]])
        if value is not None and name not in launch.values:
            launch.values[name], launch.units[name] = value, base
    return [by_id[k] for k in sorted(by_id)]


def parse_ncu_csv(text: str) -> list[Launch]:
    """Every launch in Nsight Compute CSV output (raw or details page), in launch order."""
    header, rows = _rows(text)
    if "ID" not in header:
        raise NcuCsvError("the CSV header has no ID column")
    if "Metric Name" in header and "Metric Value" in header:
        return parse_details_page(header, rows)
    return parse_raw_page(header, rows)
