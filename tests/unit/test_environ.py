"""Tests for corral.environ: what reaches the sandbox's environment, and its cwd."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral import defaults, environ
from corral.policy import Policy

HOST_ENV = {
    "PATH": "/opt/bin:/usr/bin",
    "HOME": "/home/someone",
    "LANG": "C.UTF-8",
    "TERM": "xterm",
    "USER": "someone",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
    "GITHUB_TOKEN": "ghp_secret",
    "ANTHROPIC_API_KEY": "sk-ant-secret",
    "SSH_AUTH_SOCK": "/run/user/1000/ssh-agent",
    "LD_PRELOAD": "/tmp/evil.so",
    "CI": "true",
    "GOPATH": "/home/someone/go",
}


def test_only_base_names_pass_by_default(tmp_path: Path) -> None:
    env = environ.sandbox_env(Policy(str(tmp_path)), HOST_ENV)
    allowed = {*defaults.BASE_ENV, *defaults.INSTALLER_ENV, "CORRAL_SANDBOX"}
    assert set(env) <= allowed
    assert env["PATH"] == "/opt/bin:/usr/bin"
    assert env["HOME"] == "/home/someone"
    assert env["USER"] == "someone"
    assert env["CORRAL_SANDBOX"] == "1"
    assert "TZ" not in env  # absent on the host, so absent here
    for secret in ("AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "ANTHROPIC_API_KEY"):
        assert secret not in env
    assert "SSH_AUTH_SOCK" not in env and "LD_PRELOAD" not in env
    values = set(env.values())
    assert not values & {"aws-secret-value", "ghp_secret", "sk-ant-secret"}


def test_policy_pass_and_set(tmp_path: Path) -> None:
    pol = Policy(str(tmp_path))
    pol.env.pass_names = ["CI", "GOPATH", "NOT_ON_HOST"]
    pol.env.set_values = {"GREETING": "hello", "LANG": "fr_FR.UTF-8"}
    env = environ.sandbox_env(pol, HOST_ENV)
    assert env["CI"] == "true"
    assert env["GOPATH"] == "/home/someone/go"
    assert "NOT_ON_HOST" not in env
    assert env["GREETING"] == "hello"
    assert env["LANG"] == "fr_FR.UTF-8"  # a set value wins over a passed one
    names = {*defaults.BASE_ENV, *defaults.INSTALLER_ENV, "CI", "GOPATH", "GREETING"}
    assert set(env) == names - {"TZ"} | {"CORRAL_SANDBOX"}
    assert "AWS_SECRET_ACCESS_KEY" not in env


def test_set_value_cannot_unset_sandbox_marker(tmp_path: Path) -> None:
    pol = Policy(str(tmp_path))
    pol.env.set_values = {"CORRAL_SANDBOX": "0"}
    assert environ.sandbox_env(pol, {})["CORRAL_SANDBOX"] == "1"


def test_fallbacks_for_empty_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    env = environ.sandbox_env(Policy(str(tmp_path)), {})
    assert env == {
        "PATH": defaults.FALLBACK_PATH,
        "HOME": str(tmp_path / "home"),
        "CORRAL_SANDBOX": "1",
        **defaults.INSTALLER_ENV,
    }


def test_installers_copy_inside_unless_told_otherwise(tmp_path: Path) -> None:
    """uv links from its cache by default: inside, that cache is the home layer's,
    and an environment made of links would be read-only to the next run
    (corral.linkfarm).  A passed or set value wins.  No npm_config_ variable is
    set: npm warns of any it does not know, on every command."""
    env = environ.sandbox_env(Policy(str(tmp_path)), {})
    assert env["UV_LINK_MODE"] == "copy"
    assert not any(name.lower().startswith("npm_config_") for name in env)
    pol = Policy(str(tmp_path))
    pol.env.pass_names = ["UV_LINK_MODE"]
    pol.env.set_values = {"npm_config_package_import_method": "hardlink"}
    env = environ.sandbox_env(pol, {"UV_LINK_MODE": "symlink"})
    assert env["UV_LINK_MODE"] == "symlink"
    assert env["npm_config_package_import_method"] == "hardlink"


def test_defaults_to_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_SECRET", "do-not-leak")
    monkeypatch.setenv("TERM", "vt100")
    env = environ.sandbox_env(Policy(str(tmp_path)))
    assert "CORRAL_TEST_SECRET" not in env
    assert env["TERM"] == "vt100"


def test_cwd_inside_writable_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sub = tmp_path / "ws" / "pkg"
    sub.mkdir(parents=True)
    extra = tmp_path / "extra"
    extra.mkdir()
    pol = Policy(str(tmp_path / "ws"))
    monkeypatch.chdir(sub)
    assert environ.sandbox_cwd(pol, [str(tmp_path / "ws")]) == str(sub)
    monkeypatch.chdir(extra)
    assert environ.sandbox_cwd(pol, [str(tmp_path / "ws"), str(extra)]) == str(extra)


def test_cwd_outside_writable_is_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws-sibling").mkdir()
    pol = Policy(str(tmp_path / "ws"))
    monkeypatch.chdir(tmp_path / "ws-sibling")  # shares a prefix, is not inside
    assert environ.sandbox_cwd(pol, [str(tmp_path / "ws")]) == str(tmp_path / "ws")
    monkeypatch.chdir(tmp_path)
    assert environ.sandbox_cwd(pol, [str(tmp_path / "ws")]) == str(tmp_path / "ws")


def test_cwd_through_symlink_is_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "ws")
    monkeypatch.chdir(tmp_path / "alias")
    pol = Policy(os.path.realpath(tmp_path / "ws"))
    assert environ.sandbox_cwd(pol, [pol.workspace]) == pol.workspace


def test_certificate_bundle_variables_pass_by_default(tmp_path: Path) -> None:
    host = {**HOST_ENV, **{name: f"/etc/ca/{name}.pem" for name in defaults.CA_ENV}}
    env = environ.sandbox_env(Policy(str(tmp_path)), host)
    for name in ("SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "PIP_CERT"):
        assert env[name] == f"/etc/ca/{name}.pem"
    assert set(defaults.CA_ENV) <= set(env)
    assert "AWS_SECRET_ACCESS_KEY" not in env  # the deny twin: everything else still stays out


def test_registry_variables_pass_only_when_named(tmp_path: Path) -> None:
    token = {name: f"https://user:tok-{name}@registry.test/" for name in defaults.REGISTRY_ENV}
    pol = Policy(str(tmp_path))
    env = environ.sandbox_env(pol, {**HOST_ENV, **token})
    assert not set(defaults.REGISTRY_ENV) & set(env)
    assert not any("tok-" in v for v in env.values())
    pol.env.pass_names = ["PIP_INDEX_URL", "NPM_CONFIG_REGISTRY"]
    env = environ.sandbox_env(pol, {**HOST_ENV, **token})
    assert env["PIP_INDEX_URL"] == token["PIP_INDEX_URL"]
    assert env["NPM_CONFIG_REGISTRY"] == token["NPM_CONFIG_REGISTRY"]
    assert "UV_INDEX_URL" not in env


def test_no_registry_or_token_name_among_the_defaults() -> None:
    passing = {*defaults.BASE_ENV, *defaults.CA_ENV}
    assert not passing & set(defaults.REGISTRY_ENV)
    words = ("TOKEN", "KEY", "SECRET", "PASSWORD", "_URL", "REGISTRY", "INDEX")
    assert not any(w in n for n in passing for w in words)
