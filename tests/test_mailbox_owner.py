"""The routing rule (fleetrun/plugins/mailbox/owner.py), pure: the most specific live
owner and focus, over generated folder trees (hypothesis), and the seed's examples."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetrun.plugins.mailbox.owner import focus, owner, targets
from fleetrun.plugins.mailbox.store import Role

ROOT = "/fleetrun-owner-tree"  # not a real folder: realpath leaves it as it is

parts = st.lists(st.sampled_from(["a", "b", "c"]), min_size=0, max_size=4).map(tuple)


def path_of(p: tuple[str, ...]) -> str:
    return os.path.join(ROOT, *p) if p else ROOT


def under(d: tuple[str, ...], p: tuple[str, ...]) -> bool:
    return p[: len(d)] == d


# -- the seed's examples ---------------------------------------------------------------


def test_the_seeds_example_most_specific_wins_and_no_paths_is_the_cwd() -> None:
    repo = Role("repo", "/work/repo")
    relay = Role("relay", "/work/repo/src/relay")
    assert owner(["src/relay/peer.rs"], "/work/repo", [repo, relay], {}) == (relay, "relay owns src/relay/peer.rs")
    role, why = owner([], "/work/repo", [repo, relay], {})
    assert role == repo and why == "repo owns /work/repo"


def test_several_paths_need_one_role_covering_all() -> None:
    repo = Role("repo", "/work/repo")
    relay = Role("relay", "/work/repo/src/relay")
    role, why = owner(["src/relay/peer.rs", "docs/peers.md"], "/work/repo", [repo, relay], {})
    assert role == repo
    assert owner(["src/relay/peer.rs", "docs/peers.md"], "/work/repo", [relay], {})[0] is None


def test_a_path_must_stay_inside_the_cwd() -> None:
    repo = Role("repo", "/work")
    role, why = owner(["../other/x"], "/work/repo", [repo], {})
    assert role is None and "escapes the cwd" in why
    assert targets(["a/../../x"], "/work/repo")[0] is None


def test_two_roles_on_one_folder_are_told_apart_by_focus() -> None:
    a, b = Role("a", "/w"), Role("b", "/w")
    assert owner(["src/x.py"], "/w", [a, b], {"a": "/w/src", "b": "/w/docs"}) == (
        a,
        "a owns src/x.py (its focus /w/src)",
    )
    # the deepest focus that holds every path wins
    assert owner(["src/x.py"], "/w", [a, b], {"a": "/w", "b": "/w/src"})[0] == b
    # a tie, or no focus that holds them: nobody (the task is spawned)
    assert owner(["src/x.py"], "/w", [a, b], {"a": "/w/src", "b": "/w/src"})[0] is None
    assert owner(["src/x.py"], "/w", [a, b], {"a": "/w/docs"})[0] is None
    assert owner(["src/x.py"], "/w", [a, b], {})[0] is None


def test_no_live_role_no_owner() -> None:
    role, why = owner(["x"], "/w", [], {})
    assert role is None and why == "no role is live"


def test_focus_is_the_deepest_folder_with_half_the_edits() -> None:
    assert focus([]) is None
    assert focus(["/w/src/a.py", "/w/src/b.py", "/w/docs/c.md"]) == "/w/src"
    assert focus(["/w/src/relay/a.rs", "/w/src/relay/b.rs"]) == "/w/src/relay"
    # exactly half each in two siblings: their common folder
    assert focus(["/w/src/a.py", "/w/docs/b.md"]) == "/w"


# -- generated trees ----------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    role_dirs=st.lists(parts, min_size=0, max_size=6, unique=True),
    task_paths=st.lists(parts.filter(bool), min_size=0, max_size=3),
)
def test_the_owner_is_the_most_specific_covering_role(
    role_dirs: list[tuple[str, ...]], task_paths: list[tuple[str, ...]]
) -> None:
    roles = [Role(f"r{i}", path_of(d)) for i, d in enumerate(role_dirs)]
    rel = [os.path.join(*p) for p in task_paths]
    got, why = owner(rel, ROOT, roles, {})
    wanted = task_paths or [()]
    covering = [d for d in role_dirs if all(under(d, p) for p in wanted)]
    if not covering:
        assert got is None
        return
    deepest = max(covering, key=len)  # one role per folder here: the deepest is unique
    assert got is not None and got.dir == path_of(deepest), why
    assert why.startswith(f"{got.name} owns ")


@settings(max_examples=300, deadline=None)
@given(
    shared=parts,
    foci=st.lists(st.one_of(st.none(), parts), min_size=2, max_size=4),
    task_paths=st.lists(parts.filter(bool), min_size=1, max_size=3),
)
def test_roles_on_one_folder_the_deepest_holding_focus_wins(
    shared: tuple[str, ...], foci: list, task_paths: list[tuple[str, ...]]
) -> None:
    roles = [Role(f"r{i}", path_of(shared)) for i in range(len(foci))]
    # a focus is where the role's edits are: below its folder
    fmap = {r.key: path_of(shared + f) if f is not None else None for r, f in zip(roles, foci)}
    paths = [shared + p for p in task_paths]
    got, _ = owner([os.path.join(*p) for p in paths], ROOT, roles, fmap)
    holding = [
        (i, shared + f) for i, f in enumerate(foci) if f is not None and all(under(shared + f, p) for p in paths)
    ]
    if not holding:
        assert got is None
        return
    best = max(len(f) for _, f in holding)
    winners = [i for i, f in holding if len(f) == best]
    if len(winners) > 1:
        assert got is None
    else:
        assert got is not None and got.name == f"r{winners[0]}"


@settings(max_examples=300, deadline=None)
@given(files=st.lists(parts.filter(bool), min_size=1, max_size=12))
def test_focus_holds_half_and_no_deeper_folder_does_alone(files: list[tuple[str, ...]]) -> None:
    edited = [path_of(p) + ".py" for p in files]  # a file named after the folder path
    got = focus(edited)
    assert got is not None
    need = (len(edited) + 1) // 2

    def count(d: str) -> int:
        return sum(1 for e in edited if os.path.dirname(e) == d or os.path.dirname(e).startswith(d.rstrip("/") + "/"))

    assert count(got) >= need
    # a folder right below it holding half would be deeper: only when another one does too
    children = {
        os.path.dirname(e)[len(got.rstrip("/")) + 1 :].split("/")[0]
        for e in edited
        if os.path.dirname(e).startswith(got.rstrip("/") + "/")
    }
    holding = [c for c in children if c and count(os.path.join(got, c)) >= need]
    assert len(holding) != 1
