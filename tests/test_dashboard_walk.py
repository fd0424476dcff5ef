"""A demo-like night walked in a real browser, every number on every page checked against the
records: Debian's Chromium (Playwright) opens the overview, follows its link to the sweep page,
from there every experiment's page and the morning report, and compares each number shown with
what the REST API records (GET /sweeps/{name}, /experiments/{id} with its runs), worked out here
independently of the pages' code. One number per fact: the same fact reads the same everywhere.

Two nights are walked. The fake trainer's, run through the real loop as `overnight demo` runs
its target: seed noise measured from the runs, the best re-run (its value re-measured after the
keep), kept and discarded changes, a crash and a timeout (tests/report_fixtures.py). And a night
on a machine whose speed changes under it, as beside `../shared/tools/hog.sh` (tests/load_world.
py): runs set aside, changes compared with the incumbent in other machine conditions, a keep
and the baseline re-measured.
test_dashboard_browser.py checks the pages' behaviour (clicks, tooltips, live panels); this
file checks their numbers. To walk a recorded night instead (a real `overnight demo`'s):
OVERNIGHT_WALK_DB=path/to/overnight.db OVERNIGHT_WALK_SWEEP=demo-… pytest this file.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import CHROMIUM_ARGS, SCREENSHOTS, make_app, require_chromium, serve
from load_world import load_night
from report_fixtures import noisy_night
from scipy import stats

pytestmark = pytest.mark.browser
RAN = ("kept", "discarded", "crashed", "timeout")  # the statuses that ran (plotted, counted)


@pytest.fixture(scope="module", params=["noisy", "load"])
def night(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Path, str]:
    """The database and the sweep to walk: OVERNIGHT_WALK_DB and OVERNIGHT_WALK_SWEEP name a
    recorded night (`overnight demo`'s, say) to walk instead of the fixtures'."""
    if os.environ.get("OVERNIGHT_WALK_DB"):
        if request.param == "load":
            pytest.skip("a recorded night is walked once")
        return Path(os.environ["OVERNIGHT_WALK_DB"]), os.environ["OVERNIGHT_WALK_SWEEP"]
    if request.param == "load":
        _, _, db = load_night(tmp_path_factory.mktemp("walk-load"), proposals=14,
                              gains={3: 0.08, 6: 0.012, 9: 0.05}, incumbent_every=3)
        return db, "load"
    # seed noise of 0.03 around changes of ~0.05: runs spread past their means, as on a real
    # night; the best re-run after every second proposal, so kept values are re-measured
    made = noisy_night(tmp_path_factory.mktemp("walk"), incumbent_every=2, noise=0.03)
    return made.db, made.name


@pytest.fixture(scope="module")
def browser():
    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        yield b
        b.close()


def f6(v: float | None) -> str:
    return "–" if v is None else f"{v:.6f}"


def signed6(v: float) -> str:
    """A signed number to six decimals; one that rounds to zero reads 0.000000."""
    return f"{v:+.6f}" if round(v, 6) != 0 else "0.000000"


def signed(v: float | None) -> str:
    return "" if v is None else f"{v:+.6f}"


ANY_N, ANY_CI = "⟨n⟩", "⟨ci⟩"  # in an expected text: a count, an interval the records lack


def count(n: int | None) -> str:
    return ANY_N if n is None else str(n)


def ci_text(ci: float | None, fmt: str) -> str:
    return ANY_CI if ci is None else format(ci, fmt)


def same(shown: str, want: str, how: str = "fullmatch") -> bool:
    """`shown` is `want` (how="match": starts with it, "search": holds it), ANY_N and ANY_CI
    standing for any count and any interval."""
    pattern = re.escape(want).replace(re.escape(ANY_N), r"\d+").replace(re.escape(ANY_CI),
                                                                         r"[\d.]+")
    return getattr(re, how)(pattern, shown) is not None


@dataclass
class Records:
    """The night as the REST API records it, and the figures worked out from the records."""

    sweep: dict[str, Any]
    exps: dict[int, dict[str, Any]]  # id → GET /experiments/{id} (with run_records)

    @classmethod
    def read(cls, get: Callable[[str], Any], name: str) -> Records:
        sweep = get(f"/sweeps/{name}")
        listed = get(f"/experiments?sweep={name}&limit=100")["data"]
        return cls(sweep, {e["id"]: get(f"/experiments/{e['id']}") for e in listed})

    @cached_property
    def ran(self) -> list[dict[str, Any]]:
        """The experiments that ran, in run order (the plot's x)."""
        return [self.exps[i] for i in sorted(self.exps) if self.exps[i]["status"] in RAN]

    def order(self, exp_id: int) -> int:
        return [e["id"] for e in self.ran].index(exp_id) + 1

    @property
    def count(self) -> dict[str, int]:
        return {s: sum(e["status"] == s for e in self.exps.values()) for s in RAN}

    @property
    def tried(self) -> int:
        """Changes that ran to a verdict: the baseline aside."""
        return len(self.ran) - 1

    @staticmethod
    def ok(e: dict[str, Any], own: bool = True) -> list[float]:
        """Its OK runs' values: its own, or (own=False) with the incumbent's re-runs of the
        commit it made, recorded under it."""
        return [r["metric"] for r in e["run_records"] if r["status"] == "ok"
                and r["metric"] is not None and (not own or r["role"] != "incumbent")]

    @cached_property
    def sigma(self) -> tuple[float, int]:
        """σ̂: the pooled within-commit sd of the OK runs (a commit's runs are all recorded
        under the experiment that made it), and its degrees of freedom."""
        groups = [g for g in (self.ok(e, own=False) for e in self.exps.values()) if len(g) > 1]
        ss = sum(sum((v - statistics.fmean(g)) ** 2 for v in g) for g in groups)
        df = sum(len(g) - 1 for g in groups)
        return math.sqrt(ss / df), df

    def ci(self, n: int) -> float:
        sd, df = self.sigma
        return float(stats.t.ppf(0.975, df)) * sd / math.sqrt(n)

    @staticmethod
    def test(e: dict[str, Any]) -> dict[str, Any]:
        """Its record (meta.verdict): every number its verdict rested on."""
        return e["meta"].get("verdict") or {}

    def n(self, e: dict[str, Any]) -> int:
        """The runs its value rests on: those its record names."""
        return len((self.test(e).get("change") or {}).get("runs") or [])

    def named(self, e: dict[str, Any]) -> list[float]:
        """The values of the runs its record names, read from its run records."""
        own = {r["id"]: r for r in e["run_records"]}
        return [own[i]["metric"] for i in (self.test(e).get("change") or {}).get("runs", [])]

    def set_aside(self, e: dict[str, Any]) -> int:
        return sum(r["status"] == "suspect" and r["role"] != "incumbent"
                   for r in e["run_records"])

    def reruns(self, e: dict[str, Any], set_aside: bool = False) -> int:
        return sum(r["role"] == "incumbent" and r["metric"] is not None
                   and r["status"] in (("suspect",) if set_aside else ("ok", "suspect"))
                   for r in e["run_records"])

    def runs_cell(self, e: dict[str, Any]) -> str:
        n, aside, again = self.n(e), self.set_aside(e), self.reruns(e)
        parts = [str(n)] if n or e["status"] not in ("queued", "running") else []
        parts += [f"+{aside} set aside"] if aside else []
        again_aside = self.reruns(e, set_aside=True)
        parts += [f"+{again} re-run{'s' if again != 1 else ''}" + (
            f" ({again_aside} set aside)" if again_aside else "")] if again else []
        return " ".join(parts)

    def delta_cell(self, e: dict[str, Any]) -> str:
        d, se = e["delta"], self.test(e).get("se")
        if d is None:
            return ""
        text = f"{d:+.6f}" if round(d, 6) != 0 else "0.000000"
        return text + (f" ± {se:.3g}" if se is not None else "")  # one precision everywhere

    @cached_property
    def shifted(self) -> bool:
        """Some run ran in other machine conditions (set aside, or compared beside the
        incumbent there): a commit's value is then its runs in its usual condition, which the
        records do not say apart from the sweep's baseline and best."""
        return any(r["status"] == "suspect" or r["note"]
                   for e in self.exps.values() for r in e["run_records"])

    def now(self, e: dict[str, Any]) -> tuple[float, int | None] | None:
        """A kept commit's value now and its runs, when it was re-run after the decision (the
        number of runs unknown (None) on a night with load shifts)."""
        every = self.ok(e, own=False)
        if e["status"] != "kept" or len(every) == len(self.ok(e)):
            return None
        return self.value_of(e["id"])

    def value_of(self, exp_id: int | None) -> tuple[float, int | None]:
        e = self.exps[exp_id or 0]
        every = self.ok(e, own=False)
        if not self.shifted:
            return statistics.fmean(every), len(every)
        if e["is_baseline"]:
            return self.sweep["baseline_metric"], None
        if e["id"] == self.sweep["best_experiment_id"]:
            return self.sweep["best_metric"], None
        pytest.skip("a kept commit re-run on a night with load shifts: its value now is not "
                    "in the records")

    @cached_property
    def baseline(self) -> dict[str, Any]:
        return next(e for e in self.exps.values() if e["is_baseline"])

    @property
    def gain(self) -> float:
        sign = 1.0 if self.sweep["direction"] == "minimize" else -1.0
        return sign * (self.sweep["baseline_metric"] - self.sweep["best_metric"]) + 0.0

    def gain_ci(self) -> float | None:
        (_, base_n), (_, best_n) = self.value_of(self.baseline["id"]), self.value_of(
            self.sweep["best_experiment_id"])
        if base_n is None or best_n is None:
            return None
        return self.ci(1) * math.sqrt(1 / base_n + 1 / best_n)

    @cached_property
    def load_shifted(self) -> set[int]:
        """The experiments with runs in other machine conditions: one of its own runs set
        aside (suspect), or an incumbent run started beside one of its runs."""
        beside = {r["pair_run_id"] for x in self.exps.values() for r in x["run_records"]
                  if r["pair_run_id"]}
        return {i for i, e in self.exps.items() if any(
            r["id"] in beside or (r["role"] != "incumbent" and r["status"] == "suspect")
            for r in e["run_records"])}

    @property
    def supported(self) -> int:
        """Kept changes the keep rule's test kept (its p recorded), the baseline left out."""
        return sum(e["status"] == "kept" and not e["is_baseline"] and
                   self.test(e).get("p") is not None for e in self.exps.values())

    @property
    def runs(self) -> int:
        return sum(len(e["run_records"]) for e in self.exps.values())

    @property
    def all_set_aside(self) -> int:
        return sum(r["status"] == "suspect" for e in self.exps.values()
                   for r in e["run_records"])

    @property
    def all_reruns(self) -> int:
        return sum(self.reruns(e) for e in self.exps.values())


def cells(row: Any) -> list[str]:  # a Playwright locator of a <tr>
    return [" ".join(t.split()) for t in row.locator("th, td").all_inner_texts()]


def facts(page: Any, where: str = "dl.facts") -> dict[str, str]:
    """A page's facts: each <dt>'s text (as written, not as styled) → its <dd>'s text."""
    out = {}
    for div in page.locator(f"{where} > div").all():
        out[div.locator("dt").text_content().strip()] = " ".join(
            div.locator("dd").inner_text().split())
    return out


def check_records(rec: Records) -> None:
    """The records agree with themselves: the sweep's baseline and best are their commits'
    runs now."""
    assert rec.sweep["baseline_metric"] == pytest.approx(rec.value_of(rec.baseline["id"])[0])
    assert rec.sweep["best_metric"] == pytest.approx(
        rec.value_of(rec.sweep["best_experiment_id"])[0])
    for s, n in rec.count.items():
        assert rec.sweep["counts"].get(s, 0) == n, s


def walk_overview(page: Any, rec: Records) -> str:
    """The overview's row of the sweep; returns its run hours (no record has them: the sweep
    page must read the same)."""
    s, c = rec.sweep, rec.count
    # the row whose heading is the name exactly (demo-dec05 is also in demo-dec05-2's row)
    row = cells(page.locator("#sweeps tbody tr").filter(has=page.locator(
        "th", has_text=re.compile(rf"^\s*{re.escape(s['name'])}\s*$"))))
    heads = cells(page.locator("#sweeps thead tr"))
    got = dict(zip(heads, row, strict=True))
    done = rec.tried
    assert got["Changes tried / limit"] == f"{done} / {s['max_experiments']}"
    assert got["Kept"] == str(c["kept"] - 1)  # the baseline left out
    assert got["Discarded"] == str(c["discarded"])
    assert got["Crashed"] == str(c["crashed"] + c["timeout"])
    assert got["Keep rate"] == f"{(c['kept'] - 1) / done * 100:.0f}%"
    assert got["Baseline → best"] == (f"{f6(s['baseline_metric'])} → {f6(s['best_metric'])} "
                                     f"{s['metric']}")
    assert got["Improvement"] == f"{rec.gain / abs(s['baseline_metric']) + 0.0:+.2%}"
    return got["Run hours"]


def walk_sweep(page: Any, rec: Records, run_hours: str) -> None:
    s, c = rec.sweep, rec.count
    sd, df = rec.sigma
    got = facts(page)
    (_, base_n), (_, best_n) = rec.value_of(rec.baseline["id"]), rec.value_of(
        s["best_experiment_id"])
    assert same(got[f"{s['metric']} ({s['direction']}): baseline → best now"],
                f"{f6(s['baseline_metric'])} (on {count(base_n)}) → {f6(s['best_metric'])} "
                f"(on {count(best_n)} run{'' if best_n == 1 else 's'})")
    assert got["Improvement"] == f"{rec.gain / abs(s['baseline_metric']) + 0.0:+.2%}"
    aside, again = rec.all_set_aside, rec.all_reruns
    assert got["Changes tried / limit"] == (
        f"{rec.tried} / {s['max_experiments']} ({rec.runs} runs"
        + (f", {aside} set aside" if aside else "")
        + (f", {again} re-run{'s' if again != 1 else ''} of kept commits" if again else "")
        + ")")
    assert got["Changes kept (baseline aside) / discarded / crashed"] == (
        f"{c['kept'] - 1} / {c['discarded']} / {c['crashed'] + c['timeout']}")
    assert got["Keep rate"] == f"{(c['kept'] - 1) / rec.tried * 100:.0f}%"
    assert got["Run hours"] == run_hours  # the overview's
    assert got["Budget"] == f"{s['budget']} (hard limit {s['timeout_s']:g} s)"
    assert s["budget_s"] is None or s["budget"] == f"{s['budget_s']:g} s"
    ev = facts(page, "#evidence")
    # the labels are upper-cased by the style, the terms in them are not: σ̂ must not read Σ̂
    sigma = page.locator("#evidence dt abbr.term").first
    assert sigma.inner_text() == "σ̂" and sigma.get_attribute("title")
    shown_sigma = ev["σ̂ now (run-to-run sd, pooled over the night)"]
    if not rec.shifted:  # on a night with load shifts σ̂ pools within machine conditions too
        assert shown_sigma == f"{sd:.3g} ({df} df)"
    sd = float(shown_sigma.split()[0])
    assert same(ev["Improvement ± 95 % CI"],
                f"{signed6(rec.gain)} ± {ci_text(rec.gain_ci(), '.3g')}")
    plural = "s" if rec.supported != 1 else ""
    kept_changes = c["kept"] - 1
    assert ev["Verdict"] == (
        f"{rec.supported} change{plural} kept by the test (σ̂ = {sd:.3g})" if rec.supported
        else f"nothing beat the noise (σ̂ = {sd:.3g})" if not kept_changes
        else ev["Verdict"])  # kept on one run each: the statement says so in its own words
    speeds = any(r["throughput"] is not None for e in rec.exps.values()
                 for r in e["run_records"])
    shifted = len(rec.load_shifted)
    assert ev["Machine's load"] == (
        f"checked: {shifted} experiment{'s' if shifted != 1 else ''} ran in other machine "
        "conditions" if speeds else "cannot be checked: no run reports its throughput (a "
        "num_steps or total_tokens_M summary key, or progress lines with a step and an "
        "elapsed time)")

    # the table: one row per experiment, newest first
    rows = page.locator("#experiments tbody tr")
    assert [int(t) for t in rows.locator("td:first-child").all_inner_texts()] == sorted(
        rec.exps, reverse=True)
    for i in range(rows.count()):
        row = cells(rows.nth(i))
        e = rec.exps[int(row[0])]
        # a change the early stop ended is recorded discarded and shown "stopped", as the
        # console and its page show it
        stopped = rec.test(e).get("ending") == "stopped early"
        assert row[1].split()[0] == ("stopped" if stopped else e["status"]), row
        named = rec.named(e)  # its value: the mean of the runs its record names
        if named:
            assert e["metric"] == pytest.approx(statistics.fmean(named), abs=1e-9)
        now = rec.now(e)
        assert same(row[2], f6(e["metric"]) + (f" now {f6(now[0])} on {count(now[1])}" if now
                                               else "")), row
        assert row[3] == rec.runs_cell(e), row
        assert row[4] == rec.delta_cell(e), row
        p = rec.test(e).get("p_better")
        assert row[5] == ("" if p is None else f"{p:.2f}"), row
        reported = {"peak_memory_mb", "peak_vram_mb"} & set(e["summary"])  # else blank
        assert row[6] == (f"{e['memory_gb']:.1f}" if reported else ""), row
        secs = e["training_seconds"]
        assert row[7] == ("" if secs is None else f"{secs:.1f}"), row

    # the kept stack, baseline → best
    stack = page.locator("ol.stack > li summary").all_inner_texts()
    kept = [e for i, e in sorted(rec.exps.items()) if e["status"] == "kept"]
    assert len(stack) == len(kept)
    for text, e in zip(stack, kept, strict=True):
        now = rec.now(e)
        n = rec.n(e)
        want = f"#{e['id']} {f6(e['metric'])}" + (
            f" (on {n} run{'s' if n != 1 else ''})" if n else "") + (
            f" {rec.delta_cell(e)}" if e["delta"] is not None else "")
        if now:
            want += f" now {f6(now[0])} on {count(now[1])}"
        assert same(" ".join(text.split()), f"{want} {e['description']}", "match"), (text, want)

    # the digest's head line: the same baseline and best, and the experiments by status (the
    # baseline not among the kept: no change of its own)
    better = "lower" if s["direction"] == "minimize" else "higher"
    tally = ", ".join(f"{n} {k}" for k, n in sorted({**c, "kept": c["kept"] - 1}.items()) if n)
    assert page.locator("#insights .insight-lines li").first.inner_text() == (
        f"{s['metric']} ({better} is better): baseline {f6(s['baseline_metric'])}, best "
        f"{f6(s['best_metric'])}; experiments: {tally}")

    walk_plot(page, rec)


def walk_plot(page: Any, rec: Records) -> None:
    """Each mark at its experiment's run order with its status, value and delta; each run a
    dot with its value, at its value (none of this night's runs is far enough out to be an
    edge triangle)."""
    plot = page.locator("svg.progress")
    marks = plot.locator("a.pt")
    assert marks.count() == len(rec.ran)
    for i in range(marks.count()):
        m = marks.nth(i)
        e = rec.exps[int(m.get_attribute("data-id") or 0)]
        assert m.get_attribute("class") == f"pt {e['status']}"
        assert int(m.get_attribute("data-n") or 0) == rec.order(e["id"])
        title = m.locator("title").text_content() or ""
        if e["metric"] is not None:
            assert f"{s_metric(rec)} {e['metric']:.6f}" in title, title
        if e["delta"] is not None:
            assert f"Δ {e['delta']:+.6f}" in title and "(inferred)" in title, title
    if not os.environ.get("OVERNIGHT_WALK_DB"):  # the fixtures' runs all lie on the axis
        assert plot.locator(".run.clipped").count() == 0
    # the load-shift stripes sit over exactly the experiments the header counts
    striped = set()
    for title in plot.locator("rect.load title").all_text_contents():
        a, _, b = re.search(r"runs? ([\d–]+)", title)[1].partition("–")  # type: ignore[index]
        striped |= set(range(int(a), int(b or a) + 1))
    assert striped == {rec.order(i) for i in rec.load_shifted}
    for e in rec.ran:
        dots = [t.removesuffix(" (off the axis)") for t in plot.locator(
            f".run[data-id='{e['id']}'] title").all_text_contents()]
        want = [f"run: {v:.6f}" for v in rec.ok(e)] if e["status"] in ("kept",
                                                                        "discarded") else []
        assert sorted(dots) == sorted(want), (e["id"], dots, want)


def s_metric(rec: Records) -> str:
    return str(rec.sweep["metric"])


REASON = re.compile(r"(?:(?P<value>[\d.]+) on 1 run|mean (?P<mean>[\d.]+) of (?P<n>\d+) "
                    r"runs): (?:better than|worse than|equal to) the incumbent's .*?"
                    r"\(σ̂ (?P<sigma>\S+), (?P<df>\S+) df\): t \S+, "
                    r"(?:p (?P<p>\S+), level (?P<level>\S+)|a first run keeps nothing)")


def walk_experiment(page: Any, rec: Records, e: dict[str, Any]) -> bool:
    """One experiment's page; whether it had a keep rule's reason to check."""
    assert " ".join(page.locator("h1").inner_text().split()) == (
        f"#{e['id']} {' '.join(e['description'].split())}")
    got = facts(page)
    assert got["Status"].split()[0] in (e["status"], "stopped")
    value = f6(e["metric"])
    record = rec.test(e)
    n = rec.n(e)
    if n:
        ids = ", ".join(str(i) for i in record["change"]["runs"])
        aside = len(record.get("set_aside") or [])
        value += f" (the mean of {n} run{'s' if n != 1 else ''}: {ids}" + (
            f"; {aside} set aside" if aside else "") + ")"
    now = rec.now(e)
    if now:
        verb = "measured" if e["is_baseline"] else "kept"
        value += (f" {verb} at {f6(e['metric'])} on {n} run{'s' if n != 1 else ''}; now "
                  f"{f6(now[0])} on {count(now[1])}")
    assert same(got[f"{rec.sweep['metric']} (measured)"], value), (got, value)
    shown = got["Δ vs the incumbent runs it was compared with (inferred)"]
    assert shown.startswith(rec.delta_cell(e) or "–"), (shown, e["delta"])
    best = record.get("best") or {}
    assert got["The best then"] == f6(e["best_before"]) + (
        f" (on {best['n']} run{'s' if best['n'] != 1 else ''})" if best.get("n") else "")
    if e["status"] in RAN:
        assert got["Run order"] == f"{rec.order(e['id'])} of the sweep"  # the plot's data-n
    assert got["Commit"] == (e["commit"] or "")[:10] or "–"

    # the keep rule's reason: its numbers are its record's
    test = rec.test(e)
    m = REASON.search(e["reason"] or "")
    if test and m:
        assert (m["value"] or m["mean"]) == f6(e["metric"])  # the same number, as written
        assert int(m["n"] or 1) == n
        assert m["sigma"] == f"{test['sigma']:.3g}" and m["df"] == str(test.get("df") or "∞")
        if m["p"] is None:  # one run: its look spends nothing, so the ledger's p is 1
            assert test["p"] == 1.0 and n == 1
        else:
            assert (m["p"], m["level"]) == (f"{test['p']:.2g}", f"{test['level']:.2g}")
        assert page.locator(".reason-box").first.inner_text() == f"Why: {e['reason']}"
    # a discard that was probably better says, in one sentence, why that was not enough
    plain = page.locator("#why-not-kept")
    if test and test.get("ending") == "not better" and (test.get("p_better") or 0) >= 0.5:
        lacked = (f"p at or below the level, and its p was {test['p']:.2g} against a level of "
                  f"{test['level']:.2g}." if test.get("p") is not None else
                  "a test at the night's level, and this change was not given one.")
        assert plain.inner_text() == \
            f"P(better) {test['p_better']:.2f} is not enough: a keep needs {lacked}"
    else:
        assert plain.count() == 0

    # its runs: exactly its run records, the incumbent runs started beside them (recorded
    # under the commit they re-ran) and those its record says it was compared with
    rows = page.locator("#runs tbody tr")
    own = {r["id"] for r in e["run_records"]}
    compared = set((test.get("incumbent") or {}).get("runs") or [])
    records = {r["id"]: r for x in rec.exps.values() for r in x["run_records"]
               if r["id"] in own or r["pair_run_id"] in own or r["id"] in compared}
    assert [int(t) for t in rows.locator("td:first-child").all_inner_texts()] == sorted(records)
    for i in range(rows.count()):
        row = cells(rows.nth(i))
        r = records[int(row[0])]
        beside = f" beside run {r['pair_run_id']}" if r["pair_run_id"] else ""
        assert row[1] == r["role"] + beside and row[2] == str(r["seed"]), row
        used = ("its value" if r["id"] in (test.get("change") or {}).get("runs", []) else
                "set aside" if r["id"] in (test.get("set_aside") or []) else
                "compared with" if r["id"] in compared else "")
        assert row[3] == r["status"] and row[4] == used and row[5] == f6(r["metric"]), row
        speed = r["throughput"]
        shown = "" if speed is None else (f"{speed:.0f}" if abs(speed) >= 1000 else f"{speed:.4g}")
        assert row[6] == (f"{shown} {r['throughput_unit']}" if shown else ""), row  # no exponent
    # the summary block and the log tail are of one run, named, and show its value
    named = re.search(r"of run (\d+)", page.locator("#sum-h").inner_text())
    if named and records[int(named[1])]["metric"] is not None:
        r = records[int(named[1])]
        assert page.locator("#log-h").inner_text().endswith(f"of run {r['id']}")
        summary = dict(cells(tr) for tr in page.locator("table.kv tr").all())
        metric = rec.sweep["metric"]
        assert float(summary[metric]) == pytest.approx(r["metric"], abs=5e-7)
        logged = re.findall(rf"^{metric}:\s+(\S+)", page.locator("pre.log").inner_text(),
                            re.M)
        assert logged and float(logged[-1]) == pytest.approx(r["metric"], abs=5e-7)
    return bool(test and m)


def walk_report(page: Any, rec: Records, statement: str) -> None:
    s, c = rec.sweep, rec.count
    (_, base_n), (_, best_n) = rec.value_of(rec.baseline["id"]), rec.value_of(
        s["best_experiment_id"])
    head = " ".join(page.locator("#headline").inner_text().split())
    assert same(head, f"{s['metric']} {f6(s['baseline_metric'])} → {f6(s['best_metric'])} "
                    f"({'lower' if s['direction'] == 'minimize' else 'higher'} is better; "
                    f"baseline n={count(base_n)}, best n={count(best_n)}): gain "
                    f"{signed6(rec.gain)} ± {ci_text(rec.gain_ci(), '.3g')} "
                    f"({rec.gain / abs(s['baseline_metric']) * 100 + 0.0:+.2f} %)")
    assert page.locator("#statement").inner_text() == statement  # the sweep page's verdict
    kept_text = f"{c['kept'] - 1} of {rec.tried} change{'s' if rec.tried != 1 else ''} kept " \
        "(the baseline aside)"
    assert kept_text in page.locator("#facts").inner_text()
    assert f"; {rec.runs} runs" in page.locator("#facts").inner_text()
    rows = page.locator("#kept tbody tr")
    kept = [e for i, e in sorted(rec.exps.items()) if e["status"] == "kept"
            and not e["is_baseline"]]
    assert rows.count() == len(kept)
    for i, e in enumerate(kept):
        row = cells(rows.nth(i))
        n = rec.n(e)
        assert row[0] == str(e["id"])
        assert row[2].startswith(f"{f6(e['metric'])}"), row
        now = rec.now(e)
        if now:
            assert same(row[2], f"now {f6(now[0])} on {count(now[1])}", "search"), row
        assert row[3] == str(n) and row[4] == rec.delta_cell(e), row
        assert row[5].startswith(f"{rec.test(e)['p_better']:.2f}"), row
    cost = page.locator("table", has_text="hours").locator("tr", has_text="total")
    assert cells(cost)[1] == str(rec.runs)
    marks = page.locator("svg.progress a.pt")
    assert sorted(int(m.get_attribute("data-id") or 0) for m in marks.all()) == [
        e["id"] for e in rec.ran]


def test_every_number_on_every_page_is_the_records(night: tuple[Path, str], browser) -> None:
    db, name = night
    with serve(make_app(db)) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        rec = Records.read(lambda path: page.request.get(base + path).json(), name)
        check_records(rec)
        if not os.environ.get("OVERNIGHT_WALK_DB") and name != "load":
            # the fixture's night has every kind
            assert set(RAN) <= {e["status"] for e in rec.exps.values()}
            assert any(rec.now(e) for e in rec.exps.values() if not e["is_baseline"])
        if name == "load":  # the load night: runs set aside, changes compared in several
            # machine conditions, the baseline and a keep re-measured
            assert rec.shifted and rec.all_set_aside and rec.all_reruns
            assert any(len(rec.test(e).get("blocks") or []) > 1 for e in rec.exps.values())

        page.goto(base + "/")
        run_hours = walk_overview(page, rec)
        page.locator("#sweeps").get_by_role("link", name=name, exact=True).click()
        page.wait_for_url(f"{base}/ui/sweeps/{name}")
        walk_sweep(page, rec, run_hours)
        statement = page.locator("#statement").inner_text()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "walk-sweep.png"), full_page=True)

        links = page.locator("#experiments tbody tr td:first-child a")
        hrefs = [a.get_attribute("href") or "" for a in links.all()]
        assert len(hrefs) == len(rec.exps)
        reasons = 0
        for href in hrefs:
            page.goto(base + href)
            reasons += walk_experiment(page, rec, rec.exps[int(Path(href).name)])
        assert reasons == sum(bool(REASON.search(e["reason"] or "")) for e in rec.exps.values())
        page.goto(f"{base}/ui/sweeps/{name}")
        page.locator("#report-links").get_by_role("link", name="page").click()
        page.wait_for_url(f"{base}/ui/sweeps/{name}/report")
        walk_report(page, rec, statement)
        page.close()
