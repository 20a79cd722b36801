"""`specchat simulate dsi`: the DSI paper's theorems on whole grids, hand-computed schedules, the
acceptance estimator, the command's files and its one-line errors."""

import csv
import json
import math

import numpy as np
import pytest
from helpers.cli import assert_one_line_error, run_cli
from helpers.images import png_size

from specchat.errors import SpecchatError
from specchat.simulate.command import GRID_FILE, SUMMARY_FILE, parse_range
from specchat.simulate.dsi import (
    Grid,
    acceptance_draws,
    acceptance_from_gen_rate,
    decision_times,
    expected_tokens_per_iteration,
    non_si_latency,
    simulate_dsi,
    simulate_si,
    sufficient_servers,
)
from specchat.simulate.heatmaps import FILES

LATENCIES = np.linspace(0.01, 1, 12)
ACCEPTANCES = np.linspace(0, 1, 11)


def accepted_rows(acceptances: np.ndarray, seeds: int, positions: int) -> np.ndarray:
    """Rows (acceptance, seed) of acceptances drawn as the grid draws them."""
    draws = acceptance_draws(seeds, positions)
    return (draws[None] < acceptances[:, None, None]).reshape(-1, positions)


@pytest.mark.parametrize("lookahead", [1, 3, 5])
def test_with_enough_servers_dsi_is_never_slower_than_si_or_non_si(lookahead):
    tokens = 60
    accepted = accepted_rows(ACCEPTANCES, 4, tokens + lookahead)
    for c in LATENCIES:
        si = simulate_si(accepted, c, lookahead, tokens)
        dsi = simulate_dsi(accepted, c, lookahead, None, tokens)
        # on every acceptance sequence, not only on average
        assert (dsi <= np.minimum(si, non_si_latency(tokens)) + 1e-9).all()
        # the bound on servers is enough: no verification waits (but float noise where 1 / (k c) is whole)
        enough = simulate_dsi(accepted, c, lookahead, sufficient_servers(c, lookahead), tokens)
        assert np.allclose(dsi, enough, rtol=0, atol=1e-9)
    means = Grid(LATENCIES, ACCEPTANCES, lookahead, None, tokens, seeds=4).latencies()
    assert (means.ratios()["DSI / min(SI, non-SI)"] <= 1 + 1e-9).all()


def test_sufficient_servers_is_the_papers_bound_and_at_least_two():
    assert sufficient_servers(0.01, 5) == 20  # ceil(1 / 0.05), not 21 from float noise
    assert sufficient_servers(0.03, 5) == 7
    assert sufficient_servers(0.5, 5) == 2  # k c > 1: a job of rule (2) overlaps the next block's


def test_si_is_slower_than_non_si_when_nothing_is_accepted():
    tokens, k, c = 50, 5, 0.1
    accepted = accepted_rows(np.array([0.0]), 3, tokens + k)
    # one token per iteration of k c + 1
    assert np.allclose(simulate_si(accepted, c, k, tokens), tokens * (1 + k * c))
    assert (simulate_si(accepted, c, k, tokens) > non_si_latency(tokens)).all()


def test_si_approaches_t_over_k_plus_one_forwards_when_all_is_accepted_for_free():
    tokens, k = 120, 5
    accepted = accepted_rows(np.array([1.0]), 2, tokens + k)
    assert np.allclose(simulate_si(accepted, 1e-9, k, tokens), tokens / (k + 1))
    # ceil(T / (k + 1)) iterations whatever c
    assert np.allclose(simulate_si(accepted, 0.2, k, 100), math.ceil(100 / (k + 1)) * (1 + k * 0.2))


def test_si_emits_the_geometric_mean_tokens_per_iteration():
    tokens, k, a, c = 4000, 4, 0.7, 0.0
    accepted = accepted_rows(np.array([a]), 3, tokens + k)
    iterations = simulate_si(accepted, c, k, tokens)  # with c = 0 the latency counts iterations
    assert tokens / iterations.mean() == pytest.approx(expected_tokens_per_iteration(a, k), rel=0.03)


def test_hand_computed_schedule_with_the_idle_target_rule():
    """k = 2, c = 0.75 (k c > 1), servers unlimited. Jobs of a segment (sent, drafts d, finish):
    (0, 0, 1) rule (1) d = 0; the block d = 2 is due at 1.5 > 1, so rule (2) at 1: floor(1 / 0.75)
    = 1 draft, (1, 1, 2); block (1.5, 2, 2.5); block d = 4 due at 3 > 2.5: rule (2) (2.5, 3, 3.5);
    block (3, 4, 4); block 6 due at 4.5 > 4: rule (2) (4, 5, 5). Offset q is decided by the first
    job with d >= q: r = 1, 2, 2.5, 3.5, 4, 5."""
    assert decision_times(0.75, 2, None, 6).tolist() == [1, 2, 2.5, 3.5, 4, 5]
    accepted = np.array([[True, False, True, True, True, True, True, True]])
    # DSI: rejection at offset 1 -> r(1) = 2, restart at position 2; the 6th token is offset 3 of
    # the new segment -> r(3) = 3.5; total 5.5
    assert simulate_dsi(accepted, 0.75, 2, None, 6).tolist() == [5.5]
    # SI: iterations of 2 * 0.75 + 1 = 2.5 commit 2 (p 0 -> 2), 3 (2 -> 5), 3 (5 -> 8): 7.5
    assert simulate_si(accepted, 0.75, 2, 6).tolist() == [7.5]
    assert non_si_latency(6) == 6


def test_hand_computed_schedule_with_waiting_jobs():
    """k = 1, c = 0.25, N = 2: jobs sent at 0, 0.25, 0.5, ... with d = 0, 1, 2, ...; job j starts
    at max(sent_j, finish_(j-2)): finishes 1, 1.25, 2, 2.25, 3, 3.25."""
    assert decision_times(0.25, 1, 2, 6).tolist() == [1, 1.25, 2, 2.25, 3, 3.25]
    accepted = np.array([[True, True, False, True, True, True]])
    # rejection at offset 2 -> r(2) = 2, restart at 3; the 6th token is offset 2 again -> 2
    assert simulate_dsi(accepted, 0.25, 1, 2, 6).tolist() == [4.0]


@pytest.mark.parametrize("lookahead, c", [(1, 0.5), (3, 0.2), (5, 0.01), (4, 0.25)])
def test_one_server_verifies_back_to_back(lookahead, c):
    """With k c <= 1 and one server the target verifies back to back while the drafter never
    waits: the first forward decides offset 0 (the target's own next token), each next one k more
    drafts (SI: k + 1 tokens per k c + 1, as the token after k accepted drafts is the target's).
    r(q) = 1 + ceil(q / k)."""
    tokens = 40
    expected = [1 + math.ceil(q / lookahead) for q in range(tokens)]
    assert decision_times(c, lookahead, 1, tokens).tolist() == expected
    accepted = accepted_rows(np.array([0.0, 1.0]), 1, tokens + lookahead)
    dsi = simulate_dsi(accepted, c, lookahead, 1, tokens)
    si = simulate_si(accepted, c, lookahead, tokens)
    assert dsi[0] == tokens < si[0]  # a = 0: one token per forward, like non-SI; SI pays the drafts too
    assert dsi[1] == expected[-1]  # a = 1: the T-th token is offset T - 1
    assert si[1] == pytest.approx(math.ceil(tokens / (lookahead + 1)) * (1 + lookahead * c))


def test_acceptance_estimate_inverts_the_expected_tokens_per_iteration():
    for k in (1, 4, 8):
        for a in (0.0, 0.3, 0.8, 1.0):
            assert acceptance_from_gen_rate(expected_tokens_per_iteration(a, k), k) == pytest.approx(a, abs=1e-9)
    assert acceptance_from_gen_rate(0.5, 4) == pytest.approx(0.0) and acceptance_from_gen_rate(9, 4) == pytest.approx(1)


def test_ranges_parse_into_grid_points():
    assert parse_range("0.1..0.5", "--x", 5, open_low=True).tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert parse_range("0.3", "--x", 5, open_low=False).tolist() == [0.3]
    assert parse_range("0.3..0.3", "--x", 5, open_low=False).tolist() == [0.3]
    with pytest.raises(SpecchatError, match="LO is above HI"):
        parse_range("0.5..0.1", "--x", 5, open_low=False)


def test_command_writes_four_heatmaps_and_the_tables(monkeypatch, capsys, tmp_path):
    code, out, err = run_cli(monkeypatch, capsys, "simulate", "dsi", "--out", str(tmp_path), "--steps", "3",
                             "--tokens", "20", "--seeds", "2", "--drafter-latency", "0.1..1")
    assert code == 0, err
    assert "| DSI / min(SI, non-SI) |" in out and "N = 2 (the default" in out
    for name in FILES.values():
        width, height = png_size(tmp_path / name)
        assert width <= 600 and height <= 500 and (tmp_path / name).stat().st_size < 100_000
    with (tmp_path / GRID_FILE).open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 9 and {row["non_si"] for row in rows} == {"20.0000"}
    assert float(rows[0]["si"]) == pytest.approx(20 * (1 + 5 * 0.1))  # a = 0, c = 0.1
    assert (tmp_path / SUMMARY_FILE).read_text().startswith("# DSI offline simulation")
    assert len(err.strip().splitlines()) == 6  # wrote ... per file


@pytest.mark.parametrize("args, fragment", [
    (["--drafter-latency", "0..1"], "--drafter-latency must lie in (0, 1] (got '0..1')"),
    (["--drafter-latency", "0.5..2"], "--drafter-latency must lie in (0, 1]"),
    (["--drafter-latency", "fast"], "--drafter-latency takes LO..HI or one number (got 'fast')"),
    (["--drafter-latency", "0.1..0.2..0.3"], "--drafter-latency takes LO..HI or one number"),
    (["--acceptance", "0.9..0.1"], "--acceptance 0.9..0.1: LO is above HI"),
    (["--acceptance", "-0.1..1"], "--acceptance must lie in [0, 1]"),
    (["--acceptance", "nan"], "--acceptance must lie in [0, 1]"),
    (["--steps", "0"], "--steps must be between 1 and 100 (got 0)"),
    (["--lookahead", "0"], "--lookahead must be between 1 and 64 (got 0)"),
    (["--servers", "0"], "--servers must be >= 1 (got 0)"),
])
def test_bad_ranges_and_counts_are_one_line_exit_2(monkeypatch, capsys, tmp_path, args, fragment):
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "dsi", "--out", str(tmp_path), *args)
    assert_one_line_error(code, err, fragment)


@pytest.mark.parametrize(("name", "fragment"), [("afile", "is a file, not a directory"),
                                                ("afile/sub", "cannot create it: Not a directory")])
def test_an_out_that_cannot_be_a_directory_is_one_line_exit_2(monkeypatch, capsys, tmp_path, name, fragment):
    (tmp_path / "afile").write_text("x")
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "dsi", "--out", str(tmp_path / name))
    assert_one_line_error(code, err, fragment)


def test_a_blank_out_is_one_line_not_the_current_directory(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "dsi", "--out", "")
    assert_one_line_error(code, err, "--out is empty: name a directory ('.' for the current one)")
    assert list(tmp_path.iterdir()) == []


def sd_row(budget: int, temperature: float, iterations: int, new_tokens: int, draft_s: float,
           target_s: float) -> dict:
    return {"engine": "sd", "budget": budget, "temperature": temperature, "max_depth": 24, "iterations": iterations,
            "new_tokens": new_tokens, "draft_s": draft_s, "target_s": target_s, "mean_tree_size": float(budget),
            "gen_rate": new_tokens / iterations}


def write_results(path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_from_bench_marks_the_measured_point(monkeypatch, capsys, tmp_path):
    # k = 4, a = 0.5: 1 + 0.5 + 0.25 + 0.125 + 0.0625 = 1.9375 tokens per iteration; two prompts of
    # 16 iterations and 31 tokens. Target 0.1 s per forward, draft 0.025 s per token: c = 0.25.
    rows = [sd_row(4, 0.0, 16, 31, 64 * 0.025, 16 * 0.1)] * 2
    rows.append({"engine": "autoregressive", "budget": None, "temperature": 0.0, "iterations": 31})
    write_results(tmp_path / "results.jsonl", rows)
    code, out, err = run_cli(monkeypatch, capsys, "simulate", "dsi", "--out", str(tmp_path / "sim"), "--steps",
                             "2", "--tokens", "20", "--seeds", "2", "--from-bench", str(tmp_path / "results.jsonl"))
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("| sd K=4 t=0 |"))
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[1:3] == ["0.250", "0.500"] and cells[5] == "20"
    si, dsi = float(cells[3]), float(cells[4])
    assert dsi <= min(si, 20)
    assert len(list((tmp_path / "sim").glob("*.png"))) == 4


@pytest.mark.parametrize("rows, fragment", [
    ([{"engine": "specexec", "budget": 4}], "has no sd rows: run specchat bench --engines sd"),
    ([sd_row(4, 0.6, 16, 31, 64 * 0.5, 16 * 0.1)], "sd K=4 t=0.6 drafts a token in 5.00 target forwards"),
    ([{"engine": "sd", "budget": 4, "temperature": 0.0}], "an sd row lacks max_depth, draft_s"),
    ([sd_row(4, 0.6, 16, 31, 64 * 0.5, 16 * 0.1) | {"temperature": "t"}], "an sd row's temperature is not a number"),
])
def test_from_bench_errors_are_one_line_exit_2(monkeypatch, capsys, tmp_path, rows, fragment):
    write_results(tmp_path / "results.jsonl", rows)
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "dsi", "--out", str(tmp_path), "--steps", "2",
                           "--from-bench", str(tmp_path / "results.jsonl"))
    assert_one_line_error(code, err, fragment)


def test_from_bench_missing_file_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "dsi", "--out", str(tmp_path), "--from-bench",
                           str(tmp_path / "nope.jsonl"))
    assert_one_line_error(code, err, "nope.jsonl: no such file")
