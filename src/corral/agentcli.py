"""``corral agent run|serve|log``: corral's own agent runtime (:mod:`corral.runtime`)
from the command line.  A module of its own so that ``corral run`` never loads it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from corral import runlog
from corral.cli import AGENT_LOG_OPTIONS, AGENT_OPTIONS, HelpRequested, build_policy, parse
from corral.errors import CorralError

# exit codes of corral agent run (corral help agent lists them)
EXIT_UNFINISHED = 1  # the model did not finish within --max-turns
EXIT_MODEL = 3  # the model server could not be used: unreachable, an error, a malformed answer

USAGE = (
    "usage: corral agent run --task TEXT | serve [--every DURATION] [--stdin] [--watch] "
    "[--webhook PORT] | log [OPTIONS]"
)


def main(args: list[str]) -> int:
    if args[:1] in (["-h"], ["--help"]):
        raise HelpRequested("agent")
    if not args or args[0] not in ("run", "serve", "log"):
        raise CorralError(USAGE)
    if args[0] == "log":
        opts, _ = parse(args[1:], AGENT_LOG_OPTIONS, False, command="agent log")
        return show_log(opts)
    opts, _ = parse(args[1:], AGENT_OPTIONS, False, command=f"agent {args[0]}")
    if args[0] == "run":
        if not opts.get("task"):
            raise CorralError("corral agent run needs --task TEXT")
        for flag in ("every", "stdin", "watch", "webhook"):
            if flag in opts:
                raise CorralError(f"--{flag} is for corral agent serve")
        return asyncio.run(run_task(opts))
    if "task" in opts:
        raise CorralError("--task is for corral agent run")
    return asyncio.run(serve(opts))


def agent_dir(opts: dict[str, object]) -> str:
    given = opts.get("dir")
    return str(given) if given else os.path.join(runlog.state_dir(), "agents", "default")


def _runtime(opts: dict[str, object], listeners: list[object]) -> object:
    from corral.brain import BrainConfig
    from corral.runtime import MAX_TURNS, Runtime, keep_dir_out

    try:
        max_turns = int(str(opts.get("max_turns", MAX_TURNS)))
    except ValueError:
        max_turns = 0
    if max_turns < 1:
        raise CorralError("--max-turns needs a whole number, 1 or more")
    directory = agent_dir(opts)
    policy = build_policy(opts)
    keep_dir_out(policy, directory)  # before its config is read: the sandbox's to plant
    config = BrainConfig.load(
        os.path.join(directory, "config.toml"),
        str(opts["base_url"]) if opts.get("base_url") else None,
        str(opts["model"]) if opts.get("model") else None,
        dict(os.environ),
    )
    brain = config.brain()
    return Runtime(
        brain,
        policy,
        directory=directory,
        max_turns=max_turns,
        listeners=listeners,  # type: ignore[arg-type]
    )


def _started(rt: object, opts: dict[str, object]) -> None:
    from corral.runtime import Runtime

    assert isinstance(rt, Runtime) and rt.sb is not None
    if not opts.get("quiet"):
        _err(f"corral: agent on a {rt.sb.tier.name} sandbox; log {rt.log.path}")
        for note in rt.sb.notes:
            _err(f"corral: note: {note}")


async def run_task(opts: dict[str, object]) -> int:
    from corral.runtime import Event, Runtime

    rt = _runtime(opts, [])
    assert isinstance(rt, Runtime)
    try:
        await rt.start()
        _started(rt, opts)
        answer = await rt.fire(Event("task", str(opts["task"])))
    finally:
        await rt.stop()  # also when the sandbox did not start: the model client is closed
    if answer.finish == "stop":
        print(answer.text)
        return 0
    _err(f"corral: agent: {answer.error}")
    return EXIT_UNFINISHED if answer.finish == "max_turns" else EXIT_MODEL


async def serve(opts: dict[str, object]) -> int:
    from corral.runtime import FileWatch, Runtime, StdinLines, Timer

    listeners: list[object] = []
    if "every" in opts:
        from corral.policy import parse_duration

        try:
            every = parse_duration(opts["every"])
        except ValueError as exc:
            raise CorralError(f"--every: {exc}") from None
        if not every:
            raise CorralError("--every needs a duration above 0")
        listeners.append(Timer(every))
    if opts.get("stdin"):
        listeners.append(StdinLines(0))
    if opts.get("watch"):
        listeners.append(FileWatch())
    if "webhook" in opts:
        listeners.append(_webhook(opts))
    if not listeners:
        raise CorralError(
            "corral agent serve needs a listener: --every, --stdin, --watch or --webhook"
        )
    rt = _runtime(opts, listeners)
    assert isinstance(rt, Runtime)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await rt.start()
        _started(rt, opts)
        await stopping.wait()
    finally:
        await rt.stop()  # listeners, the loop, the sandbox; every log line is written already
    if not opts.get("quiet"):
        _err("corral: agent stopped")
    return 0


def _webhook(opts: dict[str, object]) -> object:
    """The webhook listener; its token from the environment, else DIR/webhook.token
    (made once, mode 0600)."""
    from corral.runtime import Webhook

    try:
        port = int(str(opts["webhook"]))
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise CorralError("--webhook needs a port number, 1 to 65535")
    token = os.environ.get("CORRAL_AGENT_WEBHOOK_TOKEN", "")
    if not token:
        path = os.path.join(agent_dir(opts), "webhook.token")
        try:
            with open(path, encoding="ascii") as fh:
                token = fh.read().strip()
        except FileNotFoundError:
            import secrets

            token = secrets.token_urlsafe(24)
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(token + "\n")
        except OSError as exc:
            raise CorralError(f"{path}: {exc.strerror}") from None
    return Webhook(token, port)


def show_log(opts: dict[str, object]) -> int:
    try:
        count = int(str(opts.get("n", 50)))
    except ValueError:
        count = -1
    if count < 0:
        raise CorralError("-n needs a whole number, 0 or more")
    path = os.path.join(agent_dir(opts), "activity.jsonl")
    # -n N reads only the log's end; -n 0 (all of it) a record at a time
    records = runlog.tail(path, count) if count else runlog.read(path)
    for r in records:
        print(runlog.dumps(r) if opts.get("json") else line_of(r))
    return 0


def line_of(r: dict[str, object]) -> str:
    """One record as a person reads it."""
    kind, t = str(r.get("kind")), str(r.get("t", ""))
    if kind == "wake":
        what = f"{r.get('event')}: {r.get('text')}"
    elif kind == "model":
        calls = r.get("tool_calls")
        calls = calls if isinstance(calls, list) else []
        names = ", ".join(str(c.get("name")) for c in calls if isinstance(c, dict))
        what = f"turn {r.get('turn')}: " + (f"calls {names}" if names else repr(r.get("content")))
    elif kind == "tool":
        status = f"error: {r.get('error')}" if r.get("error") else f"exit {r.get('exit_code')}"
        what = f"{r.get('name')} {r.get('arguments')} -> {status} ({r.get('seconds')}s)"
    elif kind == "answer":
        what = f"{r.get('finish')} after {r.get('turns')} turns: {r.get('text') or r.get('error')}"
    elif kind == "error":
        what = f"{r.get('where')}: {r.get('message')}"
    else:
        rest = {k: v for k, v in r.items() if k not in ("t", "kind")}
        what = runlog.dumps(rest)
    from corral.errors import plain

    # a command's output and the names it made are in these records: no terminal
    # control of theirs reaches the reader's terminal (found by attacking corral)
    return plain(f"{t}  {kind:<6} {what}".replace("\n", "\\n"))


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
