"""The typed config tree: one dataclass per section, registered in Hydra's ConfigStore; torch-free."""
