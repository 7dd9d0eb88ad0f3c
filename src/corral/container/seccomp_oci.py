"""corral's syscall deny list as an OCI seccomp profile (what ``--security-opt
seccomp=FILE`` reads).  Pure: rules in, a JSON-ready dict out.

The OCI format cannot say everything corral's BPF compiler can, so each
condition is rewritten as an equal or *stricter* set of deny rules:

* OCI compares all 64 bits, corral only the low 32 (the kernel truncates the
  ``int`` arguments, so high bits must not dodge a rule): ``eq`` becomes a
  masked compare on the low word;
* several conditions on one argument are OR-ed by runc (not AND-ed), so
  ``not_in`` cannot be one rule.  It becomes a deny for every bit no allowed
  value uses, a deny for every other combination of the allowed values' bits,
  and a deny for anything above 32 bits.  For ``socket`` that is exact on the
  low word; for ``personality`` it also denies the 0xffffffff query, a value
  only used to read the current personality (stricter, never looser).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from corral.seccomp import ArgCond, SyscallRule

LOW = 0xFFFFFFFF
MAX_ENUMERATED = 256  # combinations of allowed bits spelled out one rule each


def _arg(index: int, op: str, value: int, value_two: int = 0) -> dict[str, object]:
    return {"index": index, "op": op, "value": value, "valueTwo": value_two}


def _conditions(cond: ArgCond) -> list[list[dict[str, object]]]:
    """Alternatives (OR) of argument tests (AND within one) that imply ``cond``."""
    i = cond.index
    if cond.op == "eq":
        return [[_arg(i, "SCMP_CMP_MASKED_EQ", LOW, cond.value & LOW)]]
    if cond.op == "bits_set":
        value = cond.value & LOW
        return [
            [_arg(i, "SCMP_CMP_MASKED_EQ", 1 << b, 1 << b)] for b in range(32) if value >> b & 1
        ]
    if cond.op == "ne":
        # low word != value: some bit differs
        value = cond.value & LOW
        return [[_arg(i, "SCMP_CMP_MASKED_EQ", 1 << b, (~value >> b & 1) << b)] for b in range(32)]
    if cond.op == "not_in":
        allowed = {v & LOW for v in cond.values}
        # an all-ones value would make every bit "used"; it is dropped (denied) instead
        used = 0
        for v in allowed:
            if v != LOW:
                used |= v
        alts = [
            [_arg(i, "SCMP_CMP_MASKED_EQ", 1 << b, 1 << b)] for b in range(32) if not used >> b & 1
        ]
        bits = [b for b in range(32) if used >> b & 1]
        if 1 << len(bits) > MAX_ENUMERATED:
            raise ValueError(f"argument {i}: too many allowed bit combinations to spell out")
        for n in range(1 << len(bits)):
            combo = sum(1 << b for k, b in enumerate(bits) if n >> k & 1)
            if combo not in allowed:
                alts.append([_arg(i, "SCMP_CMP_MASKED_EQ", LOW, combo)])
        alts.append([_arg(i, "SCMP_CMP_GT", LOW)])
        return alts
    raise ValueError(f"cannot express condition {cond.op!r} in an OCI profile")


def profile(rules: tuple[SyscallRule, ...], arches: tuple[str, ...] = ()) -> dict[str, object]:
    """Default allow; every corral rule becomes one or more ERRNO entries."""
    syscalls: list[dict[str, object]] = []
    for rule in rules:
        if not rule.when:
            syscalls.append(
                {"names": [rule.name], "action": "SCMP_ACT_ERRNO", "errnoRet": rule.errno}
            )
            continue
        # AND across this rule's conditions: the cross product of their alternatives
        combos: list[list[dict[str, object]]] = [[]]
        for cond in rule.when:
            combos = [c + alt for c in combos for alt in _conditions(cond)]
        for args in combos:
            syscalls.append(
                {
                    "names": [rule.name],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": rule.errno,
                    "args": args,
                }
            )
    out: dict[str, object] = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": syscalls}
    if arches:
        out["architectures"] = list(arches)
    return out


def dumps(value: object) -> str:
    """JSON for the profile's plain types, without importing json (it pulls in re and
    enum: tens of milliseconds on every run)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # names and SCMP_ constants only: plain ASCII without quotes or backslashes
        if not value.isascii() or '"' in value or "\\" in value or not value.isprintable():
            raise ValueError(f"unexpected string in a seccomp profile: {value!r}")
        return f'"{value}"'
    if isinstance(value, dict):
        return "{" + ",".join(f"{dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__}")
