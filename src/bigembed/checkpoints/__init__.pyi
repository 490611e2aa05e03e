from .compatibility import ModelMismatchError, check_checkpoint_fits, state_mismatch
from .inference import DEFAULT_CACHE_BYTES, open_for_inference
from .layout import BEST_DIR, INDEX_DIR, VERSION_FILE
from .metadata import CheckpointMetadata, IterationPosition, check_same_import
from .reading import TrainedModel, checkpoint_dir, load_trained, open_entity_store
from .start_over import start_over
from .store import CheckpointStore
from .tables import EntityTables
from .version_choice import ChosenVersion, choose_version, describe_best

__all__ = [
    "BEST_DIR",
    "DEFAULT_CACHE_BYTES",
    "INDEX_DIR",
    "VERSION_FILE",
    "CheckpointMetadata",
    "CheckpointStore",
    "ChosenVersion",
    "EntityTables",
    "IterationPosition",
    "ModelMismatchError",
    "TrainedModel",
    "check_checkpoint_fits",
    "check_same_import",
    "checkpoint_dir",
    "choose_version",
    "describe_best",
    "load_trained",
    "open_entity_store",
    "open_for_inference",
    "start_over",
    "state_mismatch",
]
