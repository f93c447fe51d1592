"""Entry points read from the dist-info folders on ``sys.path`` find what
``importlib.metadata`` finds (``fleetrun.entrypoints``)."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from fleetrun import entrypoints


def dist(site: Path, folder: str, entry_points: str, module: str = "") -> None:
    d = site / folder
    d.mkdir(parents=True)
    name, version = folder.rsplit(".", 1)[0].split("-", 1)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (d / "entry_points.txt").write_text(entry_points)
    if module:
        (site / f"{module}.py").write_text("class Plugin:\n    class Inner:\n        pass\n")


def test_what_importlib_metadata_finds_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the environment's own (CI installs plugins/fleetrun-*) are found by both, and left out below
    installed = {(ep.name, ep.value) for ep in metadata.entry_points().select(group="fleetrun")}
    first, second = tmp_path / "first", tmp_path / "second"
    dist(first, "alpha_plugin-1.0.dist-info",
         "# a comment\n[console_scripts]\nalpha = alpha:main\n\n[fleetrun]\nalpha = ep_alpha:Plugin.Inner\n"
         "  # another comment\nalpha_two = ep_alpha [extra]\n", module="ep_alpha")
    dist(first, "Beta.Plugin-2.0.dist-info", "[fleetrun]\nbeta=ep_beta\n", module="ep_beta")
    dist(first, "gamma-0.1.egg-info", "[fleetrun]\ngamma = ep_gamma\n", module="ep_gamma")
    dist(first, "nothing-1.0.dist-info", "[other]\nx = y\n")
    # the same distribution further along sys.path: the first one wins, as in importlib.metadata
    dist(second, "beta_plugin-1.0.dist-info", "[fleetrun]\nbeta_old = ep_old\n")
    for site in (second, first):
        monkeypatch.syspath_prepend(str(site))
    ours = [(ep.name, ep.value) for ep in entrypoints.entry_points("fleetrun")]
    theirs = [(ep.name, ep.value) for ep in metadata.entry_points().select(group="fleetrun")]
    assert sorted(ours) == sorted(theirs)
    assert sorted(set(ours) - installed) == [("alpha", "ep_alpha:Plugin.Inner"), ("alpha_two", "ep_alpha [extra]"),
                            ("beta", "ep_beta"), ("gamma", "ep_gamma")]
    loaded = {ep.name: ep.load() for ep in entrypoints.entry_points("fleetrun")}
    assert loaded["alpha"] is sys.modules["ep_alpha"].Plugin.Inner
    assert loaded["alpha_two"] is sys.modules["ep_alpha"] and loaded["gamma"] is sys.modules["ep_gamma"]


def test_a_zip_on_sys_path_is_left_to_importlib_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "eggs.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip
    monkeypatch.syspath_prepend(str(tmp_path / "eggs.zip"))
    assert not entrypoints._scannable()
    assert entrypoints.entry_points("fleetrun") == list(metadata.entry_points().select(group="fleetrun"))


def test_a_value_that_names_no_module_is_refused() -> None:
    with pytest.raises(ValueError, match="not an entry point"):
        entrypoints.EntryPoint("x", "not a module!", "fleetrun", "x").load()
