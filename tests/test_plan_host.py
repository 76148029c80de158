"""The host's figures at two calibrated widths (fsdp_lab/plan/host.py): read at a block's kernel time,
interpolated between the widths in log kernel time, clamped beyond them; each width fitted from its
own runs; older tables of one width read as they are; a table of several rank counts read at the
nearest."""

from __future__ import annotations

import pytest

from fsdp_lab.calibrate.host import DEPTHS, fit_widths, run_name, traced_counts, widths, with_host_section
from fsdp_lab.plan.device import Device, load_device
from fsdp_lab.plan.host import host_figures, host_section
from device_tables import host_sections
from shared_traces import traces_shared

NARROW = {"dim": 768, "block_kernel_s": 1e-3, "op_s": 4e-6, "step_s": 2e-3, "ac_block_s": 5e-4}
WIDE = {"dim": 2304, "block_kernel_s": 4e-3, "op_s": 6e-6, "step_s": 3e-3}  # no AC figure: the other width's is read


def test_a_block_between_the_widths_gets_figures_between_theirs_in_log_kernel_time():
    section = {"widths": [WIDE, NARROW]}  # in any order
    middle = host_figures(section, 2e-3)  # the geometric middle of 1 and 4 ms
    assert middle["op_s"] == pytest.approx(5e-6) and middle["step_s"] == pytest.approx(2.5e-3)
    assert host_figures(section, 1e-3)["op_s"] == pytest.approx(4e-6) and host_figures(section, 4e-3)["op_s"] == pytest.approx(6e-6)
    ops = [host_figures(section, k)["op_s"] for k in (1.2e-3, 1.5e-3, 2.5e-3, 3.5e-3)]
    assert 4e-6 < ops[0] < ops[1] < ops[2] < ops[3] < 6e-6
    assert middle["ac_block_s"] == 5e-4


def test_beyond_the_calibrated_widths_the_nearest_width_s_figures_are_read():
    section = {"widths": [NARROW, WIDE]}
    for k, edge in ((1e-5, NARROW), (9e-4, NARROW), (5e-3, WIDE), (1.0, WIDE)):
        figures = host_figures(section, k)
        assert (figures["op_s"], figures["step_s"]) == pytest.approx((edge["op_s"], edge["step_s"]))


def test_a_width_whose_kernel_time_is_not_a_time_is_refused_not_divided_by():
    for broken in (0.0, -1e-3):
        with pytest.raises(ValueError, match="block_kernel_s .* is not a time"):
            host_figures({"widths": [{**NARROW, "block_kernel_s": broken}, WIDE]}, 2e-3)


def test_figures_beside_the_widths_hold_at_every_kernel_time():
    """A figure beside the widths is read at any kernel time; a width's own figure of that name comes
    first, interpolated as the others."""
    section = {"widths": [NARROW, WIDE], "fsdp_collective_s": 1.5e-3, "measured_on": "x"}
    for k in (1e-5, 2e-3, 1.0):
        assert host_figures(section, k)["fsdp_collective_s"] == 1.5e-3
    own = [{**NARROW, "fsdp_collective_s": 1e-3}, {**WIDE, "fsdp_collective_s": 1e-3}]
    assert host_figures({**section, "widths": own}, 2e-3)["fsdp_collective_s"] == pytest.approx(1e-3)


def test_a_table_of_one_calibrated_width_is_read_at_every_kernel_time():
    """An older table's section ({"op_s": ...}, no widths) holds its figures at any block size."""
    section = {"op_s": 1e-5, "step_s": 2e-3, "compiled_kernel_s": 3e-4}
    for k in (1e-5, 1e-3, 1.0):
        assert host_figures(section, k) == section


@pytest.mark.parametrize("name", ["h200", "h100-80gb"])
def test_the_shipped_tables_have_a_section_per_width_their_blocks_priced_by_size(name):
    for count_section in host_sections(load_device(name).host):
        sections = count_section["widths"]
        assert [s["dim"] for s in sections] == [w["dim"] for w in widths()]
        assert 0 < sections[0]["block_kernel_s"] < sections[1]["block_kernel_s"]
        assert all(s["op_s"] > 0 and s["traced"]["ops_per_block"] > 0 for s in sections)


@pytest.mark.slow
def test_each_width_is_fitted_from_its_own_runs_and_priced_at_its_block_s_kernel_time():
    """Host times made from a different cost per op at each width give each width's back, and the
    wider block's kernels are priced longer on the table calibrate_device writes beside them."""
    quick = widths(quick=True)
    with traces_shared():  # the fit traces the first width again: its traces are the ones counted here
        counts = traced_counts(quick[0])  # a block's op count does not depend on its width
        op_s = {quick[0]["dim"]: 4e-6, quick[1]["dim"]: 7e-6}
        host_s = {run_name(v, L, w): (2 if v == "mb2" else 1) * counts[L].ops * op_s[w["dim"]] + 1e-3
                  for w in quick for v in ("eager", "mb2", "ac", "compiled", "ac compiled") for L in DEPTHS}
        sections = fit_widths(host_s, load_device("h200"), quick=True)
    assert [s["dim"] for s in sections] == [w["dim"] for w in quick]
    assert [s["op_s"] for s in sections] == pytest.approx([4e-6, 7e-6])
    assert [s["step_s"] for s in sections] == pytest.approx([1e-3, 1e-3])
    assert 0 < sections[0]["block_kernel_s"] < sections[1]["block_kernel_s"]


def test_a_step_over_n_gpus_is_priced_by_the_host_section_of_the_nearest_rank_count():
    """Nearest in log2, the larger on a tie (as the collectives); a table of one count, at every count."""
    two, eight = {"widths": [NARROW, WIDE]}, {"widths": [{**NARROW, "op_s": 8e-6}, {**WIDE, "op_s": 1.2e-5}]}
    table = {"by_gpus": {"2": two, "8": eight}}
    assert [host_section(table, n) is eight for n in (1, 2, 3, 4, 6, 8, 1024)] == [False, False, False, True, True, True, True]
    assert all(host_section(two, n) is two for n in (1, 4, 1024))
    device = Device("t", {"host": table})
    assert device.host_figures(1e-3, 2)["op_s"] == pytest.approx(4e-6) and device.host_figures(1e-3, 16)["op_s"] == pytest.approx(8e-6)


def test_a_host_calibration_is_filed_under_its_rank_count_beside_the_others():
    """calibrate_device.py --host-only on N ranks replaces that count's section and keeps the others';
    a section stored before counts were kept goes under the count its measured_on names."""
    older = {"widths": [NARROW, WIDE], "measured_on": "NVIDIA H100 80GB HBM3 x2, torch 2.11.0+cu130"}
    four = {"widths": [WIDE, NARROW], "measured_on": "NVIDIA H100 80GB HBM3 x4, torch 2.11.0+cu130"}
    host = with_host_section(older, 4, four)
    assert host == {"by_gpus": {"2": older, "4": four}}
    again = {**older, "measured_on": "again x2, torch"}
    assert with_host_section(host, 2, again) == {"by_gpus": {"2": again, "4": four}}
    assert with_host_section({}, 2, again) == {"by_gpus": {"2": again}}
    with pytest.raises(ValueError, match="names no rank count"):
        with_host_section({"op_s": 1e-5, "measured_on": "somewhere"}, 4, four)

