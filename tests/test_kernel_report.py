"""tools/kernel_report.py: its SASS comparison on listings it can be wrong about (padding that is not
a change, a changed instruction, two targets) and on a built wheel, and its summary of an ncu source
page."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import kernel_report as kr  # noqa: E402


def listing(pad: int, second: str) -> str:
    """A cuobjdump -sass listing of two cubins, columns padded by `pad` blanks."""
    sp = " " * pad
    body = (f"        /*0000*/{sp}LDC R1, c[0x0][0x28] ;{sp}/* 0x00000a00ff017b82 */\n"
            f"                {sp}                      {sp}/* 0x000fe20000000800 */\n"
            f"        /*0010*/{sp}{second} ;{sp}/* 0x0000000000007947 */\n"
            f"        /*0020*/{sp}EXIT ;{sp}/* 0x000000000000794d */\n")
    head = "\nFatbin elf code:\n================\narch = {a}\ncode version = [1,8]\n\n\tcode for {a}\n\t.target\t{a}\n"
    funcs = "".join(f"\n\t\tFunction : {n}\n\t.headerflags\t@\"EF_CUDA_SM90\"\n{body}" for n in ("f_a", "f_b"))
    return head.format(a="sm_90a") + funcs + head.format(a="sm_100f") + funcs


def test_padding_is_not_a_change_and_an_instruction_is():
    base = kr.parse_sass(listing(3, "BRA 0x10"))
    assert sorted(base) == [("sm_100f", "f_a"), ("sm_100f", "f_b"), ("sm_90a", "f_a"), ("sm_90a", "f_b")]
    assert {count for _, count in base.values()} == {3}  # the encoding-only lines are not instructions
    assert kr.parse_sass(listing(9, "BRA 0x10")) == base
    changed = kr.parse_sass(listing(3, "BRA 0x20"))
    assert all(changed[key][0] != base[key][0] for key in base)


def test_resources_per_target():
    text = ("arch = sm_90a\nResource usage:\n Function f_a:\n  REG:128 STACK:8 SHARED:0 LOCAL:0\n"
            "arch = sm_100f\n Function f_a:\n  REG:93 STACK:0 SHARED:0 LOCAL:0\n")
    assert kr.parse_resources(text) == {("sm_90a", "f_a"): (128, 8), ("sm_100f", "f_a"): (93, 0)}


def test_table_rows_only_what_changed():
    old = {("sm_90a", "f_a"): ("x", 10, 96, 0), ("sm_90a", "f_b"): ("y", 20, 128, 0)}
    new = {("sm_90a", "f_a"): ("x", 10, 96, 0), ("sm_90a", "f_b"): ("z", 18, 126, 8),
           ("sm_90a", "f_c"): ("w", 5, 32, 0)}
    table = kr.sass_table(old, new)
    assert "| sm_90a | f_b | changed | 20 -> 18 | 128 -> 126 | 0 -> 8 |" in table
    assert "| sm_90a | f_c | only new | 5 | 32 | 0 |" in table
    assert "f_a" not in table and table.endswith("1 of 3 functions identical, 2 not")
    assert "| sm_90a | f_a | same |" in kr.sass_table(old, new, show_all=True)


def test_a_built_wheel_against_itself(wheels):
    pytest.importorskip("nvidia")  # (cuobjdump and nvdisasm: the tools venv's NVIDIA wheels)
    found = kr.functions(wheels["cu13"])
    by_target = {}
    for arch, name in found:
        by_target.setdefault(arch, set()).add(name)
    assert len(by_target) == 2, sorted(by_target)
    sm90, other = by_target.pop("sm_90a"), by_target.popitem()[1]
    assert sm90 == other and "cula_gdn_chunk_prep_bf16_d128" in sm90 and "cula_chunk_bf16_d128_sm90a" in sm90
    md5, count, regs, stack = found[("sm_90a", "cula_gdn_chunk_prep_bf16_d128")]
    assert count > 1000 and 32 <= regs <= 255 and stack >= 0
    assert kr.sass_table(found, found).endswith(f"{len(found)} of {len(found)} functions identical, 0 not")


def test_ncu_summary(tmp_path):
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier",
            "stall_wait", "stall_barrier (Not Issued)"]
    rows = [["0x0", "  FFMA R1, R2, R3, R4", "10", "400", "0", "10", "0"],
            ["0x10", "  BAR.SYNC.DEFER_BLOCKING 0x0", "2", "100", "2", "0", "2"],
            ["0x20", "@!P0 BRA 0x0", "60", "100", "60", "0", "60"],
            ["0x30", "  HMMA.16816.F32.BF16 R0, R4, R8, R0", "28", "200", "0", "28", "0"]]
    path = tmp_path / "src.csv"
    path.write_text('"Kernel Name","k",\n' + "\n".join(",".join(f'"{c}"' for c in r) for r in [head, *rows]) + "\n")
    report = kr.ncu_report(path, items=100)
    assert "| barrier | 62.0% |" in report and "| wait | 38.0% |" in report  # of the 100 reasons' samples
    assert "| FFMA | 4 | 50.0% | 10.0% |" in report and "| all | 8 | | |" in report  # per item, of 800 executed
    assert "| 1: BAR.SYNC.DEFER_BLOCKING 0x0 | 62.0% |" in report  # the BAR and the branch after it
    assert report.index("| 2 | 60.0% |") < report.index("| 3 | 28.0% |")  # hottest first


def test_ncu_barrier_wait_lands_past_the_bar(tmp_path):
    # BAR.SYNC.DEFER_BLOCKING: the warp issues on until an instruction needs the barrier, and ncu
    # counts the wait there, however far; a wgmma wait's "barrier" samples are not a CTA barrier's.
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier",
            "stall_wait"]
    rows = [["0x0", "  BAR.SYNC.DEFER_BLOCKING 0x7, 0x100", "0", "10", "0", "0"]]
    rows += [[hex(16 * (i + 1)), f"  IADD3 R{i}, R{i}, 0x1, RZ", "1", "10", "0", "1"] for i in range(20)]
    rows += [["0x200", "  LDS R1, [R2+0x100]", "50", "10", "50", "0"],
             ["0x210", "  BAR.SYNC.DEFER_BLOCKING 0x1, 0x80", "0", "10", "0", "0"],
             ["0x220", "  WARPGROUP.DEPBAR.LE gsb0, 0x0", "30", "10", "30", "0"]]
    path = tmp_path / "src.csv"
    path.write_text('"Kernel Name","k",\n' + "\n".join(",".join(f'"{c}"' for c in r) for r in [head, *rows]) + "\n")
    report = kr.ncu_report(path)
    assert "| 0: BAR.SYNC.DEFER_BLOCKING 0x7, 0x100 | 50.0% |" in report
    assert "| 22: BAR.SYNC.DEFER_BLOCKING 0x1, 0x80 | 0.0% |" in report


def test_ncu_by_source_line(tmp_path):
    # An nvdisasm -gi listing: each instruction's inline chain, innermost first; the lines counted are
    # those of the body called at k.cuh:50 (an instruction without a chain keeps the one before's).
    chain = ('\t//## File "/s/h.cuh", line {0} inlined at "/s/k.cuh", line {1}\n'
             '\t//## File "/s/k.cuh", line {1} inlined at "/s/k.cuh", line 50\n'
             '\t//## File "/s/k.cuh", line 50 inlined at "/s/k.cu", line 9\n')
    listing = (".text.other:\n        /*0000*/                   EXIT ;\n"
               ".text.kern:\n" + chain.format(3, 20) + "        /*0000*/                   FFMA R1, R2, R3, R4 ;\n"
               "        /*0010*/                   LDS R1, [R2] ;\n" + chain.format(4, 21)
               + "        /*0020*/              @!P0 BRA 0x0 ;\n"
               '\t//## File "/s/k.cu", line 9\n        /*0030*/                   EXIT ;\n'
               "\t.section\t.nv.info,\"\",@\"SHT_CUDA_INFO\"\n")
    assert kr.listing_lines(listing, "kern", "k.cuh:50") == [
        ("FFMA", "k.cuh:20"), ("LDS", "k.cuh:20"), ("BRA", "k.cuh:21"), ("EXIT", "~k.cu:9")]
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    rows = [["0x0", "  FFMA R1, R2, R3, R4", "10", "400"], ["0x10", "  LDS R1, [R2]", "30", "400"],
            ["0x20", "@!P0 BRA 0x0", "50", "100"], ["0x30", "  EXIT", "10", "100"]]
    path = tmp_path / "src.csv"
    path.write_text('"Kernel Name","kern",\n' + "\n".join(",".join(f'"{c}"' for c in r) for r in [head, *rows]) + "\n")
    report = kr.lines_report(path, listing, "k.cuh:50", items=100)
    assert report.index("| k.cuh:21 | 50.0% | 1 |") < report.index("| k.cuh:20 | 40.0% | 8 |")
    assert "| ~k.cu:9 | 10.0% | 1 |" in report
    rows[1][1] = "  LDS.64 R2, [R4]"  # (the same opcode: still this build)
    path.write_text('"Kernel Name","kern",\n' + "\n".join(",".join(f'"{c}"' for c in r) for r in [head, *rows]) + "\n")
    kr.lines_report(path, listing, "k.cuh:50")
    rows[1][1] = "  STS [R2], R1"  # another build
    path.write_text('"Kernel Name","kern",\n' + "\n".join(",".join(f'"{c}"' for c in r) for r in [head, *rows]) + "\n")
    with pytest.raises(SystemExit, match="not the profiled build"):
        kr.lines_report(path, listing, "k.cuh:50")
