"""Batch plans (see ``jaxembed.data.plan.sampling``): the public names, re-exported."""

from jaxembed.data.plan.sampling import (  # noqa: F401
    CURRICULUM_UNITS, FORMAT, INSTANCE_ORDERS, MASK_DIRECTIONS, NEGATIVES, SAMPLING, STRATEGIES, VERSION, WALKS,
    Plan, _check_unit_size, _compressed_batches, _config_dict, _Unit, build_plan, default_plan_config, format_summary,
    instance_mask, load_instance_orders, load_scores, load_task_order, mixing_share, render_png, summarize,
    validate_data_defaults, validate_plan_config, walk_order,
)
