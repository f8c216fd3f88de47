"""The one typed configuration tree of a run, loaded from YAML plus dotted ``key=value`` overrides.

``oprl config --help`` prints every field with its default and meaning. The tree is split by concern:
``sections`` (one class per YAML section; ``algorithm`` and ``teacher`` in modules of their own), ``run``
(the root ``RunConfig`` and preset resolution), ``choices`` (loss-variant names and their plug-ins),
``loading`` (YAML, overrides, one-line errors, saving, help text). Import from ``oprl.config``: this module is
the one list of what the package exports.
"""

from oprl.config.algorithm import AlgorithmConfig
from oprl.config.judge import JudgeConfig
from oprl.config.loading import describe_fields, help_lines, load_config, read_saved, save_config
from oprl.config.run import RunConfig, algorithm_of, resolve_algorithm
from oprl.config.sections import (
    BufferConfig,
    CheckpointConfig,
    EvalConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    ReplayConfig,
    RolloutConfig,
    RuntimeConfig,
    TrackingConfig,
    TrainerConfig,
    WarmStartConfig,
)
from oprl.config.sync import SyncConfig
from oprl.config.teacher import TeacherConfig
from oprl.tasks.arithmetic import ArithmeticTaskConfig  # the built-in tasks' sections, each beside its task
from oprl.tasks.gsm8k import GSM8kTaskConfig
from oprl.tasks.math_problems import MathTaskConfig

__all__ = [
    "AlgorithmConfig",
    "ArithmeticTaskConfig",
    "BufferConfig",
    "CheckpointConfig",
    "EvalConfig",
    "GSM8kTaskConfig",
    "JudgeConfig",
    "LoggingConfig",
    "LoraConfig",
    "MathTaskConfig",
    "ModelConfig",
    "OptimConfig",
    "ReplayConfig",
    "RolloutConfig",
    "RunConfig",
    "RuntimeConfig",
    "SyncConfig",
    "TeacherConfig",
    "TrackingConfig",
    "TrainerConfig",
    "WarmStartConfig",
    "algorithm_of",
    "describe_fields",
    "help_lines",
    "load_config",
    "read_saved",
    "resolve_algorithm",
    "save_config",
]
