"""What a kernel change did to the compiled code, and where a profile's time went, without a GPU.

    python tools/kernel_report.py sass OLD NEW [--all]
    python tools/kernel_report.py ncu SOURCE.csv [--items N] [--top 20] [--lines LISTING --at FILE:LINE]

sass: OLD and NEW are backend wheels (.whl), extensions (.so) or cubins, e.g. the release wheels of
two commits (`make wheels PYTHONS=3.12 ARCHS=x86_64 DIST=...`). For each kernel function of each
target (cuobjdump -sass and -res-usage; cuobjdump and nvdisasm from the nvidia-cuda-cuobjdump /
nvidia-cuda-nvdisasm wheels, else from PATH): whether its SASS changed, its instructions,
registers and stack bytes, old and new. SASS is compared with runs of blanks collapsed (cuobjdump
pads its columns to the listing's longest line, so an unchanged function's text can differ).

ncu: the source page of one kernel's profile, `ncu -i REP --page source --csv --print-source sass
> SOURCE.csv` (captured with --set full or --section SourceCounters): the stall reasons' shares of
the warp samples, the instruction mix (executions per work item with --items N, e.g. the chunks x
heads the kernel did), the samples that wait at each CTA barrier (stall_barrier on the BAR and on
the first instruction after it that needs it, where ncu puts them), and the hottest instructions.
notes/gated-delta-rule.md (sessions 17 and 18) shows what these tables answered.
With --lines, the samples and instructions by source line: LISTING is `nvdisasm -gi` of the same
sources built with line information (`native/tools/build_fatbin.py --lineinfo --keep-cubins DIR`,
the same SASS instruction for instruction, which is checked), and --at FILE:LINE the call whose
body to split, e.g. `chunk_kda.cuh:532` (kda_chunk_prep's call of kda_prep_chunk): each
instruction counts for the line of that body it was inlined from (session 23's phase tables).
"""

from __future__ import annotations

import argparse
import collections
import csv
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def wheel_tool(name: str) -> str | None:
    """`name` from an installed nvidia-cuda-* wheel (nvidia/cu13/bin, ...), or None."""
    try:
        import nvidia  # the namespace package of NVIDIA's wheels
    except ImportError:
        return None
    for base in nvidia.__path__:
        for path in sorted(Path(base).glob(f"*/bin/{name}")):
            return str(path)
    return None


def find_tool(name: str) -> str:
    """`name` from NVIDIA's wheels (the versions the tools venv pins), else from PATH."""
    found = wheel_tool(name) or shutil.which(name)
    if not found:
        raise SystemExit(f"kernel_report: {name} not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    return found


def elf_of(path: Path, tmp: Path) -> Path:
    """The file cuobjdump reads: the extension inside a wheel, else the file itself."""
    if path.suffix != ".whl":
        return path
    with zipfile.ZipFile(path) as whl:
        sos = [n for n in whl.namelist() if n.endswith(".so")]
        if len(sos) != 1:
            raise SystemExit(f"kernel_report: {path} holds {len(sos)} extensions, expected one")
        return Path(whl.extract(sos[0], tmp))


def parse_sass(listing: str) -> dict[tuple[str, str], tuple[str, int]]:
    """{(arch, function): (md5 of its SASS with blanks collapsed, instructions)} of `cuobjdump -sass`
    (each cubin's functions follow its "arch = sm_..." line)."""
    out = {}
    marks = list(re.finditer(r"^arch = (sm_\w+)|^\s*Function : (\S+)$", listing, flags=re.M))
    arch = "?"
    for i, m in enumerate(marks):
        if m.group(1):
            arch = m.group(1)
            continue
        body = listing[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(listing)]
        text = re.sub(r"[ \t]+", " ", body)
        count = len(re.findall(r"^\s*/\*[0-9a-f]{4,}\*/\s+\S", body, flags=re.M))
        out[(arch, m.group(2))] = (hashlib.md5(text.encode()).hexdigest(), count)
    return out


def parse_resources(listing: str) -> dict[tuple[str, str], tuple[int, int]]:
    """{(arch, function): (registers, stack bytes)} of `cuobjdump -res-usage`."""
    out = {}
    arch = "?"
    for line in listing.splitlines():
        m = re.match(r"arch = (sm_\w+)", line.strip())
        if m:
            arch = m.group(1)
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            name = m.group(1)
        m = re.match(r"\s*REG:(\d+) STACK:(\d+)", line)
        if m:
            out[(arch, name)] = (int(m.group(1)), int(m.group(2)))
    return out


def functions(path: Path) -> dict[tuple[str, str], tuple[str, int, int, int]]:
    """{(arch, function): (SASS md5, instructions, registers, stack bytes)} of a wheel, .so or cubin."""
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    env = dict(os.environ, PATH=f"{Path(nvdisasm).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    with tempfile.TemporaryDirectory() as tmp:
        elf = str(elf_of(path, Path(tmp)))
        run = lambda flag: subprocess.run([cuobjdump, flag, elf], capture_output=True, text=True, env=env,  # noqa: E731
                                          check=True).stdout
        sass, res = parse_sass(run("-sass")), parse_resources(run("-res-usage"))
    return {key: (md5, count, *res.get(key, (-1, -1))) for key, (md5, count) in sass.items()}


def sass_table(old: dict, new: dict, show_all: bool = False) -> str:
    """Markdown: a row per function that changed (or every function), then the counts."""
    rows = ["| target | function | SASS | instructions | registers | stack bytes |", "|---|---|---|---|---|---|"]
    same = 0
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        state = "only old" if b is None else "only new" if a is None else "same" if a[0] == b[0] else "changed"
        same += state == "same"
        if state == "same" and not show_all:
            continue
        pair = [" -> ".join(str(x[i]) for x in (a, b) if x is not None) for i in (1, 2, 3)]
        rows.append(f"| {key[0]} | {key[1]} | {state} | " + " | ".join(pair) + " |")
    total = len(set(old) | set(new))
    return "\n".join(rows) + f"\n\n{same} of {total} functions identical, {total - same} not"


def read_source_page(path: Path) -> tuple[list[str], list[list[str]]]:
    """The header and rows of an ncu source page (its first line names the kernel)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r)
    return rows[start], [r for r in rows[start + 1:] if len(r) == len(rows[start])]


def opcode(source: str) -> str:
    """The opcode of a SASS line ("@!P0 BRA 0x10" -> "BRA", "HMMA.16816.F32 R0, ..." -> "HMMA")."""
    words = [w for w in source.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def barrier_wait(rows: list[list[str]], i: int, num) -> float:
    """The samples waiting at the CTA barrier of row i: its own stall_barrier samples and those of
    the first instruction after it that has any (a BAR.SYNC.DEFER_BLOCKING lets the warp issue on
    until an instruction that needs the barrier, where ncu counts the wait), looking no further
    than the next barrier or wgmma wait."""
    waiting = num(rows[i], "stall_barrier")
    for r in rows[i + 1:]:
        if re.search(r"\bBAR\.|DEPBAR|\bEXIT\b", " ".join(r[:2])):
            break  # (a wgmma wait's "barrier" samples are its own)
        if num(r, "stall_barrier") > 0:
            return waiting + num(r, "stall_barrier")
    return waiting


def ncu_report(path: Path, items: int | None = None, top: int = 20) -> str:
    head, rows = read_source_page(path)
    col = {name: i for i, name in enumerate(head)}
    num = lambda r, name: float(r[col[name]] or 0) if name in col else 0.0  # noqa: E731
    samples_col = "Warp Stall Sampling (All Samples)"
    total = sum(num(r, samples_col) for r in rows) or 1.0
    out = [f"{len(rows)} instructions, {int(total)} warp samples\n", "| stall reason | share of samples |", "|---|---|"]
    stalls = {name[len("stall_"):]: sum(num(r, name) for r in rows) for name in head
              if name.startswith("stall_") and "Not Issued" not in name}
    reasons = sum(stalls.values()) or 1.0  # (the reasons' own total: what ncu's warp-state table divides by)
    for name, s in sorted(stalls.items(), key=lambda x: -x[1]):
        if s / reasons >= 0.005:
            out.append(f"| {name} | {s / reasons:.1%} |")
    mix, where = collections.Counter(), collections.Counter()
    for r in rows:
        mix[opcode(r[col["Source"]])] += num(r, "Instructions Executed")
        where[opcode(r[col["Source"]])] += num(r, samples_col)
    executed = sum(mix.values())
    unit = f"per item ({items})" if items else "executed"
    out += ["", f"| opcode | {unit} | share of instructions | share of samples |", "|---|---|---|---|"]
    for op, n in mix.most_common(top):
        out.append(f"| {op} | {n / (items or 1):,.0f} | {n / executed:.1%} | {where[op] / total:.1%} |")
    out.append(f"| all | {executed / (items or 1):,.0f} | | |")
    out += ["", "| CTA barrier (line) | samples waiting there |", "|---|---|"]
    for i, r in enumerate(rows):
        if re.search(r"\bBAR\.(SYNC|RED)", r[col["Source"]]):
            out.append(f"| {i}: {r[col['Source']].strip()[:60]} | {barrier_wait(rows, i, num) / total:.1%} |")
    out += ["", "| line | share of samples | executed | instruction |", "|---|---|---|---|"]
    for i in sorted(range(len(rows)), key=lambda i: -num(rows[i], samples_col))[:top]:
        r = rows[i]
        out.append(f"| {i} | {num(r, samples_col) / total:.1%} | {num(r, 'Instructions Executed'):,.0f} | "
                   f"{r[col['Source']].strip()[:70]} |")
    return "\n".join(out)


def listing_lines(listing: str, function: str, at: str) -> list[tuple[str, str]]:
    """Per SASS instruction of `function` in an `nvdisasm -gi` listing: its opcode and the line of
    the body called at `at` ("FILE:LINE", file by base name) that it comes from, as "FILE:LINE",
    or where it is outside that call, its innermost line with "~" before it."""
    at_file, at_line = at.rsplit(":", 1)
    lines = listing.splitlines()
    start = lines.index(f".text.{function}:")
    out, frames, last = [], [], []
    for text in lines[start + 1:]:
        if text.startswith(".text.") or text.startswith("\t.section"):
            break
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?', text)
        if m:
            frames.append((os.path.basename(m[1]), m[2], os.path.basename(m[3] or ""), m[4]))
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", text)
        if not m:
            continue
        last = frames or last  # (an instruction without frames keeps the one before's)
        frames = []
        inside = [f"{f}:{ln}" for f, ln, caller, cl in last if (caller, cl) == (at_file, at_line)]
        out.append((opcode(m[1]), inside[-1] if inside else "~" + (f"{last[0][0]}:{last[0][1]}" if last else "?")))
    return out


def lines_report(path: Path, listing: str, at: str, items: int | None = None, top: int = 30) -> str:
    """The samples and instructions of an ncu source page by source line (listing_lines)."""
    head, rows = read_source_page(path)
    with open(path, newline="") as f:
        function = next(csv.reader(f))[1]
    col = {name: i for i, name in enumerate(head)}
    num = lambda r, name: float(r[col[name]] or 0) if name in col else 0.0  # noqa: E731
    where = listing_lines(listing, function, at)
    if len(where) != len(rows) or any(op != opcode(r[col["Source"]]) for (op, _), r in zip(where, rows, strict=True)):
        raise SystemExit(f"kernel_report: the listing's {function} is not the profiled build "
                         f"({len(where)} instructions against {len(rows)})")
    samples, executed = collections.Counter(), collections.Counter()
    for (_, line), r in zip(where, rows, strict=True):
        samples[line] += num(r, "Warp Stall Sampling (All Samples)")
        executed[line] += num(r, "Instructions Executed")
    total = sum(samples.values()) or 1.0
    unit = f"per item ({items})" if items else "executed"
    out = [f"| line (in the call at {at}) | share of samples | instructions {unit} |", "|---|---|---|"]
    for line, s in samples.most_common(top):
        out.append(f"| {line} | {s / total:.1%} | {executed[line] / (items or 1):,.0f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sass", help="compare the kernels of two builds")
    s.add_argument("old", type=Path)
    s.add_argument("new", type=Path)
    s.add_argument("--all", action="store_true", help="a row for every function, not only those that changed")
    n = sub.add_parser("ncu", help="summarise an ncu source page (CSV)")
    n.add_argument("csv", type=Path)
    n.add_argument("--items", type=int, help="work items of the profiled launch: instructions per item")
    n.add_argument("--top", type=int, default=20, help="rows of the opcode and hot-instruction tables")
    n.add_argument("--lines", type=Path, metavar="LISTING",
                   help="nvdisasm -gi of the same sources with line information")
    n.add_argument("--at", metavar="FILE:LINE", help="with --lines: the call whose body's lines to count")
    opts = parser.parse_args(argv)
    if opts.what == "sass":
        print(sass_table(functions(opts.old), functions(opts.new), opts.all))
    elif opts.lines:
        if not opts.at:
            parser.error("--lines needs --at FILE:LINE")
        print(lines_report(opts.csv, opts.lines.read_text(), opts.at, opts.items, opts.top))
    else:
        print(ncu_report(opts.csv, opts.items, opts.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
