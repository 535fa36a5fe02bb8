"""tools/kind/e2e.py's report: which specs each proxy passed, which differences are listed, and
the exit status that makes `make e2e` fail on an unlisted one."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def e2e():
    spec = importlib.util.spec_from_file_location("kind_e2e", ROOT / "tools/kind/e2e.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod       # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def run(e2e, proxy, **states):
    r = e2e.Run(proxy, f"c-{proxy}")
    r.specs = {name: e2e.Outcome(state) for name, state in states.items()}
    return r


def test_the_committed_lists_load_and_every_skip_has_a_reason(e2e):
    skips = e2e.load_listed(e2e.KIND / "e2e-skip.yaml")
    assert skips and all(s.reason for s in skips)
    e2e.load_listed(e2e.KIND / "e2e-differences.yaml")
    assert e2e.re.compile(e2e.skip_regex(skips))


def test_a_difference_is_explained_only_by_a_listed_pattern(e2e):
    runs = [run(e2e, "kproxy", a="passed", b="failed", c="failed", d="passed"),
            run(e2e, "nftables", a="passed", b="passed", c="passed", d="failed")]
    listed = [e2e.Listed(pattern="^b$", reason="on purpose", until="issue 99")]
    rep = e2e.report(runs, [], listed, ".", {})
    cmp = rep["comparison"]
    assert cmp["oracle_passes_kproxy_fails"] == ["b", "c"]
    assert cmp["unexplained"] == ["c"]
    assert cmp["explained"]["b"]["until"] == "issue 99"
    assert cmp["kproxy_passes_oracle_fails"] == ["d"]
    md = e2e.markdown(rep)
    assert "- b: on purpose (until: issue 99)" in md
    assert "- c: **not in tools/kind/e2e-differences.yaml**" in md


def test_specs_on_the_skip_list_carry_its_reason_and_count(e2e):
    runs = [run(e2e, "kproxy", **{"x [Feature:SCTPConnectivity] y": "not-run", "z": "passed"})]
    skips = [e2e.Listed(pattern=r"\[Feature:SCTPConnectivity\]", reason="no SCTP yet")]
    rep = e2e.report(runs, skips, [], ".", {})
    assert rep["skipped_by_us"] == 1
    assert rep["summary"]["kproxy"] == {"passed": 1, "failed": 0, "skipped": 0, "not-run": 1}
    assert rep["comparison"] == {}


def test_an_entry_with_families_holds_for_those_only(e2e, tmp_path):
    lst = tmp_path / "skip.yaml"
    lst.write_text("- {pattern: a, reason: everywhere}\n"
                   "- {pattern: b, reason: IPv4 clusters only, families: [ipv4]}\n")
    assert [s.pattern for s in e2e.load_listed(lst, "ipv4")] == ["a", "b"]
    assert [s.pattern for s in e2e.load_listed(lst, "dual")] == ["a"]
    dual = e2e.load_listed(e2e.KIND / "e2e-skip.yaml", "dual")
    assert not any(s.matches("[sig-network] [Feature:IPv6DualStack] should create service with ipv6 cluster ip")
                   for s in dual)
    assert any(s.matches("[sig-network] [Feature:IPv6DualStack] Granular Checks: Services Secondary IP Family "
                         "[LinuxOnly] should function for pod-Service: sctp [Feature:SCTPConnectivity]")
               for s in dual)
