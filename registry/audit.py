"""The audit log of the @production alias, and `forge rollback` / `forge registry history`.

    forge rollback forge-model              # @production back to the previous version that passed the gate
    forge registry history forge-model      # which version was in production when

Open-source MLflow protects no alias: anyone with write access can move @production, and it keeps no history of
the moves. So every promotion, refusal and rollback is appended here, as a tag per event on an audit run
(`registry:<name>` in the registry experiment), and what serves and what rolls back trusts @production only where
this log put it.
"""

from __future__ import annotations

import getpass
import json
import logging
from collections.abc import Sequence
from typing import Any

from forge import ForgeError
from forge.config import ForgeConfig
from forge.io import utc_now
from forge.tracking import client_for, experiment_id
from registry.store import ALIAS, production

log = logging.getLogger("forge.registry")

EVENT_PREFIX = "forge.event."


def audited_production(cfg: ForgeConfig, client, name: str, if_missing: str) -> tuple[Any, str, list[str], str]:
    """@production, its version as a string, the audit log's production stack and its top as text ("v3" or "none"),
    for checking that the alias is where `forge promote`/`forge rollback` left it. ForgeError when there is none."""
    prod = production(client, name)
    if prod is None:
        raise ForgeError(f"{name} has no @{ALIAS} version: {if_missing}")
    stack = production_stack(events(cfg, name))
    # str(): the version is an int in the sqlite store, a str over REST
    return prod, str(prod.version), stack, f"v{stack[-1]}" if stack else "none"


def _audit_run(cfg: ForgeConfig, client, name: str, create: bool = True) -> str | None:
    exp = experiment_id(client, cfg)
    found = client.search_runs(
        [exp], filter_string=f"tags.`forge.kind` = 'registry' and tags.`forge.model` = '{name}'", max_results=1
    )
    if found:
        return found[0].info.run_id
    if not create:
        return None
    note = f"Audit log of `forge promote` / `forge rollback` for {name}: a tag per event."
    tags = {"forge.kind": "registry", "forge.model": name, "mlflow.note.content": note}
    return client.create_run(exp, run_name=f"registry:{name}", tags=tags).info.run_id


def append_event(cfg: ForgeConfig, client, name: str, event: dict[str, Any], now: str, user: str) -> None:
    from mlflow.entities import Metric

    run_id = _audit_run(cfg, client, name)
    seq = len(_events_of(client.get_run(run_id))) + 1
    record = {"seq": seq, "time": now, "user": user, **event}
    client.set_tag(run_id, f"{EVENT_PREFIX}{seq:06d}", json.dumps(record))
    if event["action"] in ("promote", "rollback"):  # the production version over time, as a chart in the UI
        client.log_batch(run_id, metrics=[Metric("production_version", float(event["version"]), _millis(), seq)])


def _events_of(audit) -> list[dict[str, Any]]:
    tags = audit.data.tags
    return [json.loads(tags[k]) for k in sorted(k for k in tags if k.startswith(EVENT_PREFIX))]


def events(cfg: ForgeConfig, name: str | None = None) -> list[dict[str, Any]]:
    """Every promote, refusal and rollback of the model, oldest first."""
    name = name or cfg.registry.model_name
    client = client_for(cfg)
    run_id = _audit_run(cfg, client, name, create=False)
    return _events_of(client.get_run(run_id)) if run_id else []


def production_stack(log_events: list[dict[str, Any]]) -> list[str]:
    """Replay the moves: a promotion pushes its version, a rollback pops back to its target. Top = in production."""
    stack: list[str] = []
    for e in log_events:
        version = str(e["version"])
        if e["action"] == "promote" and (not stack or stack[-1] != version):
            stack.append(version)
        elif e["action"] == "rollback":
            while stack and stack[-1] != version:
                stack.pop()
            if not stack:
                stack.append(version)
    return stack


def history(cfg: ForgeConfig, name: str | None = None) -> list[dict[str, Any]]:
    """Production periods, oldest first: {version, from, until (None: still in production), action, user}."""
    return production_periods(events(cfg, name))


def production_periods(log_events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    periods: list[dict[str, Any]] = []
    for e in log_events:
        if e["action"] not in ("promote", "rollback"):
            continue
        if periods:
            periods[-1]["until"] = e["time"]
        periods.append({"version": str(e["version"]), "from": e["time"], "until": None, "action": e["action"],
                        "user": e.get("user"), "seq": e["seq"]})  # fmt: skip
    return periods


def format_history(log_events: list[dict[str, Any]]) -> str:
    """The events table, then which version was in production when."""
    if not log_events:
        return "no promotions, refusals or rollbacks recorded"
    events_rows = [("seq", "time", "action", "version", "previous", "user", "failing")]
    for e in log_events:
        events_rows.append((str(e["seq"]), e["time"], e["action"], str(e["version"]), str(e.get("previous") or "-"),
                            str(e.get("user") or ""), ",".join(e.get("failing") or []) or "-"))  # fmt: skip
    periods_rows = [("version", "in production from", "until", "by")]
    periods_rows += [(f"v{p['version']}", p["from"], p["until"] or "now", f"{p['action']} ({p['user']})")
                     for p in production_periods(log_events)]  # fmt: skip
    return _table(events_rows) + "\n\n" + _table(periods_rows)


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


# ----------------------------------------------------------------------------------------------------------------
# rollback


def rollback(cfg: ForgeConfig, name: str | None = None) -> dict[str, Any]:
    """Move @production back to the version that was in production before the current one and passed the gate."""
    name = name or cfg.registry.model_name
    client = client_for(cfg)
    prod, prod_v, stack, audited = audited_production(cfg, client, name, "nothing to roll back")
    if not stack or stack[-1] != prod_v:
        raise ForgeError(
            f"@{ALIAS} of {name} is v{prod_v} but the audit log's is {audited}: the alias was moved outside "
            "`forge promote`; promote the intended version again with `forge promote`"
        )
    for version in reversed(stack[:-1]):
        if version == prod_v:
            continue
        try:
            mv = client.get_model_version(name, version)
        except Exception:  # noqa: BLE001 - deleted since: try the one before
            continue
        if mv.tags.get("forge.gate.decision") != "pass":
            continue
        now, user = utc_now(), getpass.getuser()
        client.set_registered_model_alias(name, ALIAS, version)
        client.set_model_version_tag(name, version, "forge.production.since", now)
        client.set_model_version_tag(name, prod_v, "forge.production.rolled_back", now)
        append_event(cfg, client, name, {"action": "rollback", "version": version, "previous": prod_v}, now,
                      user)  # fmt: skip
        log.info("rollback: %s @%s v%s -> v%s", name, ALIAS, prod_v, version)
        return {"name": name, "version": version, "previous": prod_v}
    raise ForgeError(f"{name}: no earlier version passed the gate before v{prod_v}; nothing to roll back to")


def _millis() -> int:
    import time

    return int(time.time() * 1000)
