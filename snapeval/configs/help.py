"""What ``snapeval run --help`` lists: the config groups a user picks an option of, by the resolver
``${snapeval_config_groups:}`` of ``conf/hydra/help/snapeval.yaml``.

Hydra's own listing shows every group under ``conf/`` with every config stored in it: the schemas that the
files of a group extend (``model_schema``, ``ruler_schema``, ...) and the gate specs of ``conf/gates/``,
which ``snapeval gate --spec`` reads, as if they were options to pick. This one leaves them out.
"""

from __future__ import annotations

from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from omegaconf import OmegaConf

RESOLVER = "snapeval_config_groups"
SCHEMA_SUFFIX = "_schema"  # of the ConfigStore names the files of a group extend (snapeval/configs/store.py)
NOT_PICKED = ("hydra", "gates")  # Hydra's own groups; the gate specs (snapeval gate --spec FILE)


def config_groups() -> str:
    """``group: option, option, ...`` per group a run picks from, as Hydra lists them, less the schemas
    and the groups of :data:`NOT_PICKED`."""
    loader = GlobalHydra.instance().config_loader()
    lines = []
    for group in sorted(set(loader.list_groups("")) - set(NOT_PICKED)):
        options = loader.get_group_options(group, ObjectType.CONFIG)
        if picked := sorted(option for option in options if not option.endswith(SCHEMA_SUFFIX)):
            lines.append(f"{group}: {', '.join(picked)}")
    return "\n".join(lines)


def register_help() -> None:
    """Register :func:`config_groups` as the resolver the help template calls (again: replaced)."""
    OmegaConf.register_new_resolver(RESOLVER, config_groups, replace=True)
