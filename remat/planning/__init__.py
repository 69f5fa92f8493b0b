"""Planning: from one joint graph's facts to the Plan it runs with. ``planner.plan_joint_graph``
runs the stage: ``decisions`` (what the rules forbid, and why), the default cut,
``candidates`` (hull, checkpoint-segment and nested plans; ``nesting`` rewrites the graph for
the last), ``choice`` (everything a budget decides, its compiled re-plan included) and
``build_plan`` (the ``Plan`` of a cut)."""
