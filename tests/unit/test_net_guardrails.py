"""Guardrail files (corral.net.guardrails): the parser and its fallbacks, the hash
marker, the ``[guardrails]`` policy keys, the chain hook's decisions, and
``corral rules list|check|hash|pull`` (pull from a directory and from an HTTPS
index served on 127.0.0.1)."""

from __future__ import annotations

import hashlib
import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import policy as pol
from corral.cli import main
from corral.errors import EXIT_USAGE, PolicyError
from corral.net import guardrails as gr
from corral.net.hooks import Chain, Destination, Request, hooks_for

CRITICAL = """\
---
title: No deletes on the API
risk_tier: Critical
version: 2
hosts: [api.test]
methods:
  - delete
paths: ["/api/**"]
owner: ops
tags: [a, b]
---
# Deleting

Never delete.
"""


def parse(text: str, name: str = "g/deploy_checklist.md") -> gr.Guardrail:
    return gr.parse(text, name)


# -- the parser ---------------------------------------------------------------------------


def test_front_matter_keys_and_enforcing_keys() -> None:
    g = parse(CRITICAL)
    assert (g.title, g.tier, g.version) == ("No deletes on the API", "CRITICAL", "2")
    assert g.hosts == ["api.test"] and g.methods == ["DELETE"] and g.paths == ["/api/**"]
    assert g.unknown == ["owner", "tags"]  # inert: listed, no error
    assert g.enforcing and g.state == "unhashed" and g.content_hash is None
    assert g.body == "# Deleting\n\nNever delete.\n"
    assert g.hash == hashlib.sha256(b"# Deleting\n\nNever delete.").hexdigest()


@pytest.mark.parametrize(
    ("word", "tier"),
    [
        ("low", "LOW"),
        ("Medium", "MEDIUM"),
        ("HIGH", "HIGH"),
        ("cRiTiCaL", "CRITICAL"),
        ("severe", None),
        ("", None),
        ("'HIGH'", "HIGH"),
        ("[HIGH]", None),
    ],
)
def test_risk_tier_is_case_insensitive_and_never_guessed(word: str, tier: str | None) -> None:
    assert parse(f"---\nrisk_tier: {word}\n---\nbody\n").tier == tier
    assert parse("---\ntitle: t\n---\nbody\n").tier is None  # absent: null


def test_title_falls_back_to_heading_then_file_name() -> None:
    assert parse("---\ntitle: Given\n---\n# Heading\n").title == "Given"
    assert parse("---\nversion: 1\n---\nintro\n# The heading\n## sub\n").title == "The heading"
    assert parse("no heading here\n").title == "Deploy Checklist"
    assert parse("x\n", "postgres-migration.md").title == "Postgres Migration"
    assert parse("##  not a title\n", "a_b-c.md").title == "A B C"


def test_body_without_fence_is_the_whole_trimmed_file() -> None:
    g = parse("\n\n  # Notes\nline\n\n")
    assert g.body == "# Notes\nline" and g.title == "Notes" and not g.enforcing
    assert g.hash == hashlib.sha256(b"# Notes\nline").hexdigest()


def test_hash_ignores_line_ends_and_surrounding_blank_space_only() -> None:
    assert gr.body_hash("a\r\nb\n\n") == gr.body_hash("\na\nb") == gr.body_hash("a\nb")
    assert gr.body_hash("a\nb") != gr.body_hash("a\n b")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("---\ntitle: a\n", "bad.md:1: malformed front matter: the fence opened here is never"),
        ("---\ntitle: a\nno colon here\n---\n", "bad.md:3: malformed front matter: expected"),
        ("---\ntitle: a\n  x: 1\n---\n", "bad.md:3: malformed front matter: nested values"),
        ("---\n- item\n---\n", "bad.md:2: malformed front matter: a list item with no key"),
        ("---\na: 1\n\n# c\na: 2\n---\n", "bad.md:5: malformed front matter: a is set twice"),
        ("---\ntitle: 'open\n---\n", "bad.md:2: malformed front matter: unclosed quote"),
        ("---\nhosts: [a.test\n---\n", "bad.md:2: malformed front matter: unclosed ["),
        ("---\nhosts: [a.test,,b]\n---\n", "bad.md:2: malformed front matter: an empty item"),
        ("---\ntitle:x\n---\n", "bad.md:2: malformed front matter: a space must follow"),
        ("---\nversion: 1\nmethods: [GET]\n---\n", "bad.md:3: methods: needs hosts"),
        ("---\nhosts: [a.test]\nmethods: [GE T]\n---\n", "bad.md:3: methods: not an HTTP"),
        ("---\nhosts: [a.test]\npaths: [api]\n---\n", "bad.md:3: paths: bad path glob"),
        ("---\nhosts: ['a b']\n---\n", "bad.md:2: hosts: "),
        ("---\nhosts: []\n---\n", "bad.md:2: hosts: an empty list matches nothing"),
        ("---\nhosts: [a.test]\naction: maybe\n---\n", "bad.md:3: action: expected log"),
        ("---\nhosts: [a.test]\nmax_body: 12\n---\n", "bad.md:3: max_body: size 12 has no"),
        ("---\ncontent_hash: abc\n---\n", "bad.md:2: content_hash: expected 64 hex"),
        ("---\ntitle: [a, b]\n---\n", "bad.md:2: title: expected one value"),
    ],
)
def test_malformed_front_matter_names_file_and_line(text: str, where: str) -> None:
    with pytest.raises(gr.GuardrailError) as info:
        gr.parse(text, "bad.md")
    assert str(info.value).startswith(where), str(info.value)
    assert "\n" not in str(info.value)


def test_comments_blank_lines_quotes_and_scalar_lists() -> None:
    g = parse('---\n# a comment\n\ntitle: "A: quoted"\nhosts: a.test\nmethods: GET\n---\n')
    assert g.title == "A: quoted" and g.hosts == ["a.test"] and g.methods == ["GET"]


def test_the_readmes_example_parses_as_written() -> None:
    """Copied from the README, it failed three ways: a "]" in a list's comment, a
    key whose value is only a comment, and a placeholder hash."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("### Guardrails: Markdown files") :]
    start = section.index("```markdown\n") + 12
    example = section[start : section.index("\n```", start)]
    g = parse(example + "\n")
    assert (g.title, g.tier, g.version) == ("Deleting customer data", "CRITICAL", "3")
    assert g.hosts == ["api.example.org"] and g.methods == ["DELETE"]
    assert g.paths == ["/v1/customers/**"] and g.content_hash is None


@pytest.mark.parametrize(
    ("line", "hosts"),
    [
        ("hosts: [a.test]  # like [network] allow", ["a.test"]),
        ("hosts:   # a list follows\n  - c.test", ["c.test"]),
    ],
)
def test_a_comment_after_a_value_is_no_part_of_it(line: str, hosts: list[str]) -> None:
    assert parse(f"---\n{line}\n---\n").hosts == hosts
    quoted = parse('---\nhosts: ["a.test", b.test]  # [x]\n---\n')
    assert quoted.hosts == ["a.test", "b.test"]


# -- the marker ---------------------------------------------------------------------------


def test_hash_goes_inside_the_fence_as_its_last_line() -> None:
    hashed = gr.with_hash(CRITICAL, "x.md")
    lines = hashed.split("\n")
    close = lines.index("---", 1)
    assert lines[close - 1] == f"content_hash: {parse(CRITICAL).hash}"
    assert hashed.count("---\n") == 2  # never a second fence
    assert hashed.replace(lines[close - 1] + "\n", "") == CRITICAL  # nothing else moved
    g = parse(hashed)
    assert g.state == "clean" and g.hash == parse(CRITICAL).hash and g.unknown == ["owner", "tags"]


def test_hash_is_idempotent_and_a_rehash_replaces_the_marker() -> None:
    once = gr.with_hash(CRITICAL, "x.md")
    assert gr.with_hash(once, "x.md") == once
    edited = once.replace("Never delete.", "Never delete anything.")
    assert parse(edited).state == "edited"
    again = gr.with_hash(edited, "x.md")
    assert again.count("content_hash:") == 1 and parse(again).state == "clean"
    moved = "---\ncontent_hash: " + "0" * 64 + "\ntitle: t\n---\nb\n"
    assert (
        gr.with_hash(moved, "x.md") == f"---\ntitle: t\ncontent_hash: {gr.body_hash('b')}\n---\nb\n"
    )


def test_a_file_without_a_fence_gets_one_holding_only_the_marker() -> None:
    text = "# Notes\n\nsome prose\n"
    hashed = gr.with_hash(text, "notes.md")
    assert hashed == f"---\ncontent_hash: {gr.body_hash(text)}\n---\n{text}"
    g = parse(hashed)
    assert g.state == "clean" and g.title == "Notes" and gr.with_hash(hashed, "n.md") == hashed


def test_crlf_files_keep_their_line_ends() -> None:
    text = "---\r\ntitle: t\r\n---\r\nbody\r\n"
    hashed = gr.with_hash(text, "x.md")
    assert hashed == f"---\r\ntitle: t\r\ncontent_hash: {gr.body_hash('body')}\r\n---\r\nbody\r\n"
    assert parse(hashed).state == "clean"


# -- policy keys --------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_policy_dirs_and_tier_table(tmp_path: Path) -> None:
    write(tmp_path / "g" / "a.md", CRITICAL)
    toml = write(
        tmp_path / "corral.toml",
        '[network]\nmode = "proxy"\nallow = ["api.test"]\n\n[guardrails]\ndirs = ["g"]\n'
        '[guardrails.tiers]\nHIGH = "deny"\nnull = "Log"\n',
    )
    p = pol.load(str(tmp_path), str(toml))
    assert p.guardrails.dirs == [str(tmp_path / "g")]
    assert p.guardrails.tiers == {
        "low": "log",
        "medium": "log",
        "high": "deny",
        "critical": "deny",
        "null": "log",
    }
    assert [g.title for g in pol.check_guardrails(p)] == ["No deletes on the API"]
    assert p.to_dict()["guardrails"] == {
        "dirs": [str(tmp_path / "g")],
        "tiers": p.guardrails.tiers,
        "files": {str(tmp_path / "g" / "a.md"): parse(CRITICAL).hash},  # in the digest
    }
    assert "guardrails" not in pol.Policy(str(tmp_path)).to_dict()  # older digests stay equal
    assert f"{tmp_path}/g/" in p.write_deny_patterns()  # policy: not writable from inside


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[guardrails.tiers]\nlow = "log"\nsevere = "deny"\n',
            ":3: guardrails.tiers.severe: unknown tier",
        ),
        (
            '[guardrails]\ntiers = { severe = "deny" }\n',
            ":2: guardrails.tiers.severe: unknown tier",
        ),
        ('[guardrails.tiers]\nhigh = "block"\n', ":2: guardrails.tiers.high: expected log, allow"),
        ('[guardrails]\ndirs = "g"\n', ":2: guardrails.dirs: expected a list of strings"),
        ('[guardrails]\npaths = ["g"]\n', ":2: guardrails.paths: unknown key"),
        ('[guardrails]\ndirs = ["."]\n', "is the workspace or holds it"),
        ('[guardrails]\ndirs = ["missing"]\n', "missing: cannot list guardrails: No such file"),
    ],
)
def test_bad_guardrail_policy_keys_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    toml = write(tmp_path / "corral.toml", text)
    with pytest.raises(PolicyError) as info:
        pol.load(str(tmp_path), str(toml))
    assert message in info.value.message and info.value.code == EXIT_USAGE, info.value.message


def test_a_malformed_guardrail_file_fails_the_policy_load(tmp_path: Path) -> None:
    write(tmp_path / "g" / "bad.md", "---\ntitle: x\nnot a key\n---\n")
    toml = write(tmp_path / "corral.toml", '[guardrails]\ndirs = ["g"]\n')
    with pytest.raises(PolicyError) as info:
        pol.load(str(tmp_path), str(toml))
    assert info.value.message == (
        f"guardrails: {tmp_path}/g/bad.md:3: malformed front matter: expected 'key: value'"
    )


# -- the hook: decisions ------------------------------------------------------------------


def guardrail(tier: str, methods: str, extra: str = "", name: str = "x.md") -> gr.Guardrail:
    return gr.parse(
        f"---\nrisk_tier: {tier}\nversion: 7\nhosts: [api.test]\nmethods: [{methods}]\n"
        f"paths: [/api/**]\n{extra}---\n# {tier} rule\n",
        f"/g/{name}",
    )


def decide(
    guards: list[gr.Guardrail], method: str, target: str, table: dict[str, str] | None = None
) -> tuple[str, str, dict[str, object]] | None:
    hook = gr.GuardrailHook(guards, table or dict(gr.DEFAULT_TIER_ACTIONS))
    request = Request(method, target, [], 0)
    verdict = hook.on_request(Destination("r", "https", "api.test", 443), request)
    if verdict is None:
        return None
    return verdict.decision, verdict.reason, request.audit


def test_tiers_map_to_actions_by_default() -> None:
    assert decide([guardrail("LOW", "GET")], "GET", "/api/x")[:1] == ("allow",)  # type: ignore[index]
    assert decide([guardrail("medium", "GET")], "GET", "/api/x")[:1] == ("allow",)  # type: ignore[index]
    assert decide([guardrail("HIGH", "GET")], "GET", "/api/x")[:1] == ("ask",)  # type: ignore[index]
    assert decide([guardrail("CRITICAL", "GET")], "GET", "/api/x")[:1] == ("deny",)  # type: ignore[index]
    assert decide([guardrail("nonsense", "GET")], "GET", "/api/x")[:1] == ("ask",)  # type: ignore[index]
    # not matched: no opinion (the host's other rules decide)
    assert decide([guardrail("CRITICAL", "DELETE")], "GET", "/api/x") is None
    assert decide([guardrail("CRITICAL", "GET")], "GET", "/other") is None


def test_the_file_action_only_tightens_and_the_table_overrides() -> None:
    assert decide([guardrail("LOW", "GET", "action: deny\n")], "GET", "/api/x")[0] == "deny"  # type: ignore[index]
    assert decide([guardrail("CRITICAL", "GET", "action: allow\n")], "GET", "/api/x")[0] == "deny"  # type: ignore[index]
    table = dict(gr.DEFAULT_TIER_ACTIONS, critical="log", null="log")
    assert decide([guardrail("CRITICAL", "GET")], "GET", "/api/x", table)[0] == "allow"  # type: ignore[index]
    assert decide([guardrail("", "GET")], "GET", "/api/x", table)[0] == "allow"  # type: ignore[index]


def test_the_strictest_guardrail_decides_and_is_audited() -> None:
    low, high = guardrail("LOW", "GET", name="low.md"), guardrail("HIGH", "GET", name="high.md")
    found = decide([low, high], "get", "//api//x")
    assert found is not None
    decision, reason, audit = found
    assert decision == "ask" and reason.startswith("ask: GET /api/x needs approval: HIGH rule")
    assert audit["guardrail"] == {
        "file": "/g/high.md",
        "title": "HIGH rule",
        "tier": "HIGH",
        "version": "7",
        "hash": gr.body_hash("# HIGH rule\n"),
        "hash_state": "unhashed",
        "action": "ask",
    }


def test_an_ambiguous_path_to_a_guarded_host_is_denied() -> None:
    assert decide([guardrail("LOW", "GET")], "GET", "/api/%2e%2e%2fx%252F")[0] == "deny"  # type: ignore[index]


def test_a_guardrail_applies_however_an_origin_reads_an_encoded_slash() -> None:
    g = gr.parse(
        "---\nrisk_tier: CRITICAL\nhosts: [api.test]\nmethods: [DELETE]\n"
        "paths: [/api/projects/*]\n---\n# projects\n",
        "/g/projects.md",
    )
    assert decide([g], "DELETE", "/api/projects/group%2Fproject")[0] == "deny"  # type: ignore[index]
    assert decide([g], "DELETE", "/api/projects/7")[0] == "deny"  # type: ignore[index]
    assert decide([g], "DELETE", "/api/projects/group/project") is None  # two segments to all


def test_a_guardrail_holds_for_the_path_with_a_format_suffix() -> None:
    """Rails routes ``PUT /api/merge.json`` to the route of ``/api/merge``
    (``(.:format)``): a guardrail on the one holds for the other.  Twin: another
    segment with a format is not the guardrail's."""
    g = gr.parse(
        "---\nrisk_tier: CRITICAL\nhosts: [api.test]\nmethods: [PUT]\n"
        "paths: [/api/pulls/*/merge]\n---\n# merges\n",
        "/g/merge.md",
    )
    assert decide([g], "PUT", "/api/pulls/1/merge.json")[0] == "deny"  # type: ignore[index]
    assert decide([g], "PUT", "/api/pulls/1/merge.json/")[0] == "deny"  # type: ignore[index]
    assert decide([g], "PUT", "/api/pulls/1/merged.json") is None


@pytest.mark.parametrize(
    ("methods", "method", "target", "header"),
    [
        ("DELETE", "POST", "/api/x", (b"x-http-method-override", b"delete")),
        ("GET", "GET", "/public/x", (b"x-original-url", b"/api/users")),
    ],
    ids=["method-override", "routing-header"],
)
def test_a_request_is_guarded_as_what_its_override_header_names(
    methods: str, method: str, target: str, header: tuple[bytes, bytes]
) -> None:
    """A POST with X-HTTP-Method-Override: DELETE is served as a DELETE, and
    X-Original-URL names the path an origin serves: a guardrail on that method
    or path holds.  Twin: the same request without the header is not the
    guardrail's."""
    hook = gr.GuardrailHook([guardrail("CRITICAL", methods)], gr.DEFAULT_TIER_ACTIONS)
    dest = Destination("r", "https", "api.test", 443)
    verdict = hook.on_request(dest, Request(method, target, [header], 0))
    assert verdict is not None and verdict.decision == "deny"
    assert hook.on_request(dest, Request(method, target, [], 0)) is None  # twin


def test_a_head_is_guarded_as_the_get_it_is_served_as() -> None:
    """Werkzeug (Flask), Starlette, Express, Rails and Django serve a HEAD with the
    GET handler, side effects and all: a guardrail on GET /api/** let HEAD
    /api/x through (found by attacking the proxy).  It holds for the HEAD too,
    in any case and named by an override header.  Twins: a HEAD elsewhere is
    not the guardrail's, and a guardrail on DELETE has no say on a HEAD."""
    dest = Destination("r", "https", "api.test", 443)
    for tier, decision in (("CRITICAL", "deny"), ("HIGH", "ask")):
        hook = gr.GuardrailHook([guardrail(tier, "GET")], gr.DEFAULT_TIER_ACTIONS)
        for request in (
            Request("HEAD", "/api/x", [], 0),
            Request("head", "/api/x", [], 0),
            Request("POST", "/api/x", [(b"x-http-method-override", b"HEAD")], 0),
        ):
            verdict = hook.on_request(dest, request)
            assert verdict is not None and verdict.decision == decision, (tier, request.method)
        assert hook.on_request(dest, Request("HEAD", "/other", [], 0)) is None  # twin
    hook = gr.GuardrailHook([guardrail("CRITICAL", "DELETE")], gr.DEFAULT_TIER_ACTIONS)
    assert hook.on_request(dest, Request("HEAD", "/api/x", [], 0)) is None


def test_max_body_bounds_a_logged_request() -> None:
    hook = gr.GuardrailHook([guardrail("LOW", "POST", "max_body: 1K\n")], gr.DEFAULT_TIER_ACTIONS)
    request = Request("POST", "/api/x", [], 10)
    hook.on_request(Destination("r", "https", "api.test", 443), request)
    assert request.body_limit == 1024 and request.body_rule == "guardrail x.md"


def test_guardrails_join_network_rules_in_one_chain_deny_wins(tmp_path: Path) -> None:
    write(tmp_path / "g" / "c.md", CRITICAL)
    write(tmp_path / "g" / "l.md", "---\nrisk_tier: low\nhosts: [api.test]\nmethods: [GET]\n---\n")
    toml = write(
        tmp_path / "corral.toml",
        '[network]\nmode = "proxy"\nallow = ["api.test", "open.test"]\n\n'
        '[[network.rules]]\nhost = "api.test"\nmethods = ["GET", "DELETE"]\naction = "allow"\n\n'
        '[guardrails]\ndirs = ["g"]\n[tls]\npassthrough = ["open.test"]\n',
    )
    p = pol.load(str(tmp_path), str(toml))
    chain = Chain(hooks_for(p), p.tls.passthrough)
    assert chain.needs_inspection("api.test", 443) and not chain.needs_inspection("open.test", 443)

    def ask(method: str) -> tuple[str, str, object]:
        request = Request(method, "/api/x", [], 0)
        verdict = chain.request(Destination("r", "https", "api.test", 443), request)
        assert verdict is not None
        return verdict.decision, verdict.rule, request.audit.get("guardrail")

    decision, rule, audit = ask("DELETE")  # the rule allows, the guardrail denies: deny
    assert (decision, rule) == ("deny", "guardrail c.md")
    decision, rule, audit = ask("GET")  # both allow; the guardrail's line still lands
    assert decision == "allow" and isinstance(audit, dict) and audit["tier"] == "LOW"
    assert ask("POST")[:2] == ("deny", "network.rules")  # the rules' default deny holds


def test_passthrough_of_a_guarded_host_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "g" / "c.md", CRITICAL)
    toml = write(
        tmp_path / "corral.toml",
        '[network]\nmode = "proxy"\nallow = ["api.test"]\n[guardrails]\ndirs = ["g"]\n'
        '[tls]\npassthrough = ["api.test"]\n',
    )
    with pytest.raises(PolicyError, match=r"guardrail .*c\.md \('api.test'\) needs to see"):
        pol.load(str(tmp_path), str(toml))


# -- the CLI ------------------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    write(tmp_path / "g" / "critical.md", CRITICAL)
    write(tmp_path / "g" / "notes.md", "# Team notes\n\nprose only\n")
    write(tmp_path / "g" / "ignored.txt", "not a guardrail")
    write(
        tmp_path / "corral.toml",
        '[network]\nmode = "proxy"\nallow = ["api.test", "127.0.0.1", "plain.test"]\n'
        'hosts = { "api.test" = "127.0.0.1" }\n\n'
        '[[network.rules]]\nhost = "plain.test"\nmethods = ["GET"]\naction = "allow"\n\n'
        '[guardrails]\ndirs = ["g"]\n',
    )
    return tmp_path


def test_rules_list(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "hash", str(workspace / "g" / "notes.md")]) == 0
    (workspace / "g" / "notes.md").write_text(
        (workspace / "g" / "notes.md").read_text() + "edited\n"
    )
    capsys.readouterr()
    code, out, err = cli(capsys, "rules", "list", "--workspace", str(workspace))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["FILE", "TITLE", "TIER", "VERSION", "HASH", "ENFORCES"]
    assert "No deletes on the API" in lines[1] and "CRITICAL" in lines[1]
    assert " unhashed  deny DELETE" in lines[1]  # columns apart, the last one too
    assert "deny DELETE api.test /api/** (inert keys: owner, tags)" in lines[1]
    assert "Team notes" in lines[2] and " edited " in lines[2] and "not enforcing" in lines[2]
    assert len(lines) == 3  # ignored.txt is not a guardrail
    main(["rules", "hash", str(workspace / "g" / "notes.md")])
    capsys.readouterr()
    assert " clean " in cli(capsys, "rules", "list", "--dir", str(workspace / "g"))[1]


def test_rules_list_of_a_malformed_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "g" / "bad.md", "---\ntitle: a\n")
    code, out, err = cli(capsys, "rules", "list", "--dir", str(tmp_path / "g"))
    assert (code, out) == (EXIT_USAGE, "")
    assert err == (
        f"corral: {tmp_path}/g/bad.md:1: malformed front matter: "
        "the fence opened here is never closed (---)\n"
    )
    code, _, err = cli(capsys, "rules", "list", "--dir", str(tmp_path / "none"))
    assert code == EXIT_USAGE and "none: cannot list guardrails: No such file" in err


def test_rules_check_explains_and_sends_nothing(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = str(workspace)
    code, out, _ = cli(
        capsys, "rules", "check", "DELETE", "https://api.test/api/x", "--workspace", ws
    )
    assert code == 1
    assert "decision: deny\nrule: guardrail critical.md\nreason: DELETE /api/x is denied" in out
    assert "guardrail: No deletes on the API (" in out and "risk CRITICAL, version 2" in out
    assert "intercepted: yes" in out
    code, out, _ = cli(capsys, "rules", "check", "--workspace", ws, "GET", "https://api.test/api/x")
    assert code == 0 and out.startswith("decision: allow\nrule: 127.0.0.1\n")
    code, out, _ = cli(capsys, "rules", "check", "--workspace", ws, "POST", "http://plain.test/x")
    assert code == 1 and "rule: network.rules\nreason: no rule for plain.test allows POST /x" in out
    code, out, _ = cli(capsys, "rules", "check", "--workspace", ws, "GET", "http://plain.test/x")
    assert code == 0 and "rule: network.rules[1]" in out
    code, out, _ = cli(capsys, "rules", "check", "--workspace", ws, "GET", "https://else.test/")
    assert code == 1 and "rule: default" in out and "intercepted: no" in out
    code, _, err = cli(capsys, "rules", "check", "--workspace", ws, "GET", "ftp://x/")
    assert code == EXIT_USAGE and err == "corral: ftp://x/: expected an http:// or https:// URL\n"


def test_rules_check_says_rules_do_not_open_a_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "corral.toml").write_text(
        '[network]\nmode = "proxy"\nallow = ["open.test"]\n'
        '[[network.rules]]\nhost = "api.test"\nmethods = ["GET"]\naction = "allow"\n'
        '[[network.rules]]\nhost = "open.test"\nmethods = ["GET"]\naction = "allow"\n'
    )
    ws = str(tmp_path)
    code, out, _ = cli(capsys, "rules", "check", "--workspace", ws, "GET", "https://api.test/")
    assert code == 1 and "rule: default" in out
    assert "note: network.rules[1] names this host, but rules only narrow" in out
    code, out, _ = cli(capsys, "rules", "check", "--workspace", ws, "GET", "https://open.test/")
    assert code == 0 and "rule: network.rules[2]" in out and "only narrow" not in out
    code, out, _ = cli(capsys, "rules", "check", "--workspace", ws, "GET", "https://else.test/")
    assert code == 1 and "note:" not in out  # no rule names it: nothing to say


def test_rules_hash_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "c.md", CRITICAL)
    code, out, _ = cli(capsys, "rules", "hash", str(path))
    assert code == 0 and out == f"{path}: content_hash {gr.body_hash(parse(CRITICAL).body)}\n"
    once = path.read_text()
    assert once == gr.with_hash(CRITICAL, "c.md")
    assert cli(capsys, "rules", "hash", str(path))[0] == 0 and path.read_text() == once
    bad = write(tmp_path / "bad.md", "---\nx\n---\n")
    code, _, err = cli(capsys, "rules", "hash", str(bad))
    assert (
        code == EXIT_USAGE
        and err == f"corral: {bad}:2: malformed front matter: expected 'key: value'\n"
    )
    assert bad.read_text() == "---\nx\n---\n"


def test_rules_usage_errors_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "rules")
    assert code == EXIT_USAGE and err.startswith("corral: usage: corral rules list|check")
    code, out, _ = cli(capsys, "rules", "--help")
    assert code == 0 and "--force" in out and "--dir DIR" in out and "--ca FILE" in out
    code, _, err = cli(capsys, "rules", "list", "--bogus")
    assert code == EXIT_USAGE and "unknown option --bogus for corral rules list" in err
    code, out, _ = cli(capsys, "--help")
    assert "corral rules list|check METHOD URL|hash FILE...|pull SRC" in out


def test_pull_from_a_directory_refuses_hand_edits_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    write(src / "critical.md", CRITICAL)
    write(src / "notes.md", "# Notes\nprose\n")
    code, out, _ = cli(capsys, "rules", "pull", str(src), "--dir", str(dst))
    assert code == 0 and out == f"new: {dst}/critical.md\nnew: {dst}/notes.md\n"
    for name in ("critical.md", "notes.md"):
        pulled = parse((dst / name).read_text())
        assert pulled.state == "clean" and (dst / name).read_text().count("---\n") == 2
    assert cli(capsys, "rules", "pull", str(src), "--dir", str(dst))[1].startswith("unchanged:")
    # upstream changed, local clean: updated
    write(src / "notes.md", "# Notes\nnew prose\n")
    assert (
        f"updated: {dst}/notes.md" in cli(capsys, "rules", "pull", "--dir", str(dst), str(src))[1]
    )
    # a hand edit locally: refused, naming it, nothing written
    edited = (dst / "notes.md").read_text() + "my local change\n"
    (dst / "notes.md").write_text(edited)
    write(src / "critical.md", CRITICAL.replace("Never delete.", "Never, ever delete."))
    before = (dst / "critical.md").read_text()
    code, out, err = cli(capsys, "rules", "pull", str(src), "--dir", str(dst))
    assert code == 1 and out == ""
    assert err.startswith("corral: rules pull: refused to overwrite files edited by hand")
    assert err.rstrip().endswith(f": {dst}/notes.md") and err.count("\n") == 1
    assert (dst / "notes.md").read_text() == edited and (dst / "critical.md").read_text() == before
    # --force overwrites
    code, out, _ = cli(capsys, "rules", "pull", str(src), "--dir", str(dst), "--force")
    assert code == 0 and parse((dst / "notes.md").read_text()).body == "# Notes\nnew prose\n"
    assert "Never, ever delete." in (dst / "critical.md").read_text()


def test_pull_refuses_a_local_file_that_pull_never_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "src" / "a.md", "# A\n")
    write(tmp_path / "dst" / "a.md", "# mine, never hashed\n")
    code, _, err = cli(
        capsys, "rules", "pull", str(tmp_path / "src"), "--dir", str(tmp_path / "dst")
    )
    assert code == 1 and str(tmp_path / "dst" / "a.md") in err


def test_pull_refuses_a_malformed_source_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "src" / "a.md", "# fine\n")
    write(tmp_path / "src" / "b.md", "---\nrisk_tier: high\n  nested: 1\n---\n")
    code, _, err = cli(capsys, "rules", "pull", str(tmp_path / "src"), "--dir", str(tmp_path / "d"))
    assert code == EXIT_USAGE and "b.md:3: malformed front matter: nested values" in err
    assert not (tmp_path / "d").exists()


class IndexServer:
    """An HTTPS origin on 127.0.0.1 serving a directory, with a certificate from
    the tests' origin CA (tests/tls_origin.py)."""

    def __init__(self, root: Path, certs: Path) -> None:
        from tests.tls_origin import OriginCA

        self.ca = OriginCA(certs)
        cert, key = self.ca.server_files(("127.0.0.1",))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kw: object) -> None:
                super().__init__(*args, directory=str(root), **kw)  # type: ignore[arg-type]

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[IndexServer, Path]]:
    root = tmp_path / "site"
    write(root / "guard" / "critical.md", CRITICAL)
    write(root / "other" / "notes.md", "# Notes\n")
    server = IndexServer(root, tmp_path / "certs")
    try:
        yield server, root
    finally:
        server.close()


def test_pull_from_an_https_index(
    index: tuple[IndexServer, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, root = index
    base = f"https://127.0.0.1:{server.port}"
    write(root / "guard" / "index.json", json.dumps(["critical.md", f"{base}/other/notes.md"]))
    dst, ca = tmp_path / "dst", str(server.ca.cert_path)
    code, out, err = cli(
        capsys, "rules", "pull", f"{base}/guard/index.json", "--dir", str(dst), "--ca", ca
    )
    assert (code, err) == (0, "") and out == f"new: {dst}/critical.md\nnew: {dst}/notes.md\n"
    assert (dst / "critical.md").read_text() == gr.with_hash(CRITICAL, "c.md")
    assert parse((dst / "notes.md").read_text()).state == "clean"
    # a hand edit is refused over HTTPS as from a directory; --force overwrites
    (dst / "critical.md").write_text((dst / "critical.md").read_text() + "local\n")
    code, _, err = cli(
        capsys, "rules", "pull", f"{base}/guard/index.json", "--dir", str(dst), "--ca", ca
    )
    assert code == 1 and f"{dst}/critical.md" in err
    args = ["rules", "pull", f"{base}/guard/index.json", "--dir", str(dst), "--ca", ca, "--force"]
    assert cli(capsys, *args)[0] == 0 and parse((dst / "critical.md").read_text()).state == "clean"


def test_pull_from_https_fails_closed(
    index: tuple[IndexServer, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, root = index
    base = f"https://127.0.0.1:{server.port}"
    dst = str(tmp_path / "dst")
    write(root / "guard" / "index.json", '["critical.md"]')
    # the origin's CA not trusted: a verification failure, nothing written
    code, _, err = cli(capsys, "rules", "pull", f"{base}/guard/index.json", "--dir", dst)
    assert code == 1 and "cannot fetch" in err and "CERTIFICATE_VERIFY_FAILED" in err
    ca = str(server.ca.cert_path)
    for body, message in (
        ("{not json", "the index is not JSON"),
        ('{"files": []}', "must be a JSON array of file URLs"),
        ('["../x.txt"]', "not a NAME.md file"),
        ('["http://127.0.0.1/a.md"]', "only https:// files are pulled"),
        ('["missing.md"]', "HTTP 404"),
    ):
        write(root / "guard" / "index.json", body)
        code, _, err = cli(
            capsys, "rules", "pull", f"{base}/guard/index.json", "--dir", dst, "--ca", ca
        )
        assert code == 1 and message in err and err.count("\n") == 1, err
    assert not Path(dst).exists()
    code, _, err = cli(capsys, "rules", "pull", "http://127.0.0.1/x", "--dir", dst)
    assert code == EXIT_USAGE and "only a directory or an https:// index" in err


def test_pull_follows_no_redirect_to_plain_http(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.tls_origin import OriginCA

    ca = OriginCA(tmp_path / "certs")
    cert, key = ca.server_files(("127.0.0.1",))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:9/index.json")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}/index.json"
        args = ["rules", "pull", url, "--dir", str(tmp_path / "d"), "--ca", str(ca.cert_path)]
        code, _, err = cli(capsys, *args)
        assert code == 1 and err.endswith(
            "redirected to http://127.0.0.1:9/index.json: only https:// is followed\n"
        )
    finally:
        server.shutdown()
        server.server_close()


def test_pull_from_an_empty_directory_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "src").mkdir()
    code, out, _ = cli(capsys, "rules", "pull", str(tmp_path / "src"), "--dir", str(tmp_path / "d"))
    assert code == 0 and out == f"nothing to pull: {tmp_path}/src has no guardrail files\n"


def test_a_cached_guardrail_decision_is_audited_and_limits_every_time() -> None:
    g = guardrail("CRITICAL", "DELETE", name="del.md")
    logged = guardrail("LOW", "GET", "max_body: 10B\n", name="get.md")
    hook = gr.GuardrailHook([g, logged], dict(gr.DEFAULT_TIER_ACTIONS))
    dest = Destination("r", "https", "api.test", 443)
    for _ in range(2):  # decided, then from the cache
        denied = Request("DELETE", "/api/x", [], 0)
        verdict = hook.on_request(dest, denied)
        assert verdict is not None and verdict.decision == "deny"
        assert denied.audit["guardrail"]["file"] == "/g/del.md"  # type: ignore[index]
        allowed = Request("GET", "/api/x", [], 0)  # the twin: logged, allowed, bounded
        verdict = hook.on_request(dest, allowed)
        assert verdict is not None and verdict.decision == "allow"
        assert (allowed.body_limit, allowed.audit["guardrail"]["file"]) == (10, "/g/get.md")  # type: ignore[index]
        assert hook.on_request(dest, Request("GET", "/other", [], 0)) is None  # not matched
    assert hook.sees_requests_to("api.test", 443) and not hook.sees_requests_to("else.test", 443)
    long = Request("DELETE", "/api/" + "x" * 5000, [], 0)  # decided, not kept
    verdict = hook.on_request(dest, long)
    assert verdict is not None and verdict.decision == "deny"
    assert all(len(key[3]) < 5000 for key in hook._decided)


def test_what_yaml_tools_read_is_read_so_or_refused() -> None:
    """Found by attacking the guardrails: "risk_tier: CRITICAL  # never" (the
    README's own style) was read as an unknown tier, null, so ask where the
    author meant deny; a "--- " fence with a trailing space made the file body
    only, enforcing nothing; "&t CRITICAL" and "!!str CRITICAL" were null too.
    A trailing comment is dropped, a fence may end in white space, and YAML's
    anchors, tags and block values are an error naming the line.  The twin: a
    quoted value keeps its "#"."""
    head = "hosts: [api.test]\n"
    g = gr.parse(f"---\n{head}risk_tier: CRITICAL   # never\n---\nbody\n", "a.md")
    assert g.tier == "CRITICAL"
    g = gr.parse(f"--- \n{head}risk_tier: high\n---  \nbody\n", "b.md")
    assert g.tier == "HIGH" and g.enforcing and g.body.strip() == "body"
    g = gr.parse(
        f'---\n{head}title: "Deploy #5"  # the fifth\nmethods: [GET] # read\n---\n', "c.md"
    )
    assert g.title == "Deploy #5" and g.methods == ["GET"]
    for value in ("&t CRITICAL", "!!str CRITICAL", "*t", "|"):
        with pytest.raises(gr.GuardrailError, match=r"d\.md:3: .*anchors"):
            gr.parse(f"---\n{head}risk_tier: {value}\n---\n", "d.md")


def test_a_body_is_decided_alike_by_the_rules_and_the_guardrails() -> None:
    """One function reads a POST's ``_method`` for both hooks
    (httprules.form_override): the body is asked for where a method it could
    name is denied or asked for, then decided as each method it names, the
    strictest winning (an ask for PUT no longer hid a deny of DELETE named after
    it); a ``post`` is read too (Symfony upper-cases the method before it looks
    for ``_method``).  Twins: a body naming PUT alone is asked, and one naming
    no method is allowed by the rules and none of the guardrails' business."""
    from corral.net.httprules import HttpRulesHook

    entries: list[dict[str, object]] = [
        {"host": "api.test", "methods": ["PUT"], "action": "ask"},
        {"host": "api.test", "methods": ["DELETE"], "action": "deny"},
        {"host": "api.test", "action": "allow"},
    ]
    rules = HttpRulesHook.from_policy(entries)
    guards = gr.GuardrailHook(
        [guardrail("HIGH", "PUT", name="put.md"), guardrail("CRITICAL", "DELETE", name="del.md")],
        dict(gr.DEFAULT_TIER_ACTIONS),
    )
    dest = Destination("r", "https", "api.test", 443)
    form = [(b"content-type", b"application/x-www-form-urlencoded")]
    cases = [
        ("POST", b"_method=PUT,DELETE", "deny", "deny"),
        ("post", b"_method=delete", "deny", "deny"),
        ("POST", b"_method=PUT", "ask", "ask"),
        ("post", b"title=x", "allow", None),
    ]
    for hook in (rules, guards):
        for method, body, by_rules, by_guards in cases:
            request = Request(method, "/api/x", list(form), len(body))
            first = hook.on_request(dest, request)
            assert first is not None and first.decision == "deny" and "_method" in first.reason
            assert request.wants_body == len(body), (hook.name, method, body)
            request.body, request.wants_body = body, 0
            verdict = hook.on_request(dest, request)
            expected = by_rules if hook is rules else by_guards
            assert (verdict.decision if verdict else None) == expected, (hook.name, body)
            if hook is guards and expected is not None:
                wanted = "/g/del.md" if expected == "deny" else "/g/put.md"
                assert request.audit["guardrail"]["file"] == wanted  # type: ignore[index]
