"""The MLflow model registry and its promotion gate: the one path by which a model reaches @production.

register.py   `forge register`: a run's candidate becomes a version, with its evidence and lineage.json
gate.py       the policy (configs/policies/gate.yaml) and its checks: pure logic over downloaded evidence
gate_table.py the decision as a table (`forge promote` prints it) and as a tag per check on the version
stats.py      the interval arithmetic the quality and regression checks decide with (Wilson, paired bootstrap)
promote.py    `forge promote`: downloads a version's evidence, runs the gate, moves @production if it passes
audit.py      the audit log of every alias move, `forge rollback` and `forge registry history`
serving.py    what `forge serve` and `forge bundle` may serve: @production's files and evidence, re-judged every time
signature.py  the gate key, and the decision record `forge promote` signs and `forge serve` checks
store.py      reading versions, the alias and a version's files back from MLflow (what the others share)
"""
