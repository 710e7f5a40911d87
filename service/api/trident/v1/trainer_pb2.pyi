from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    D_TYPE_UNSPECIFIED: _ClassVar[DType]
    D_TYPE_FLOAT32: _ClassVar[DType]
    D_TYPE_FLOAT64: _ClassVar[DType]
    D_TYPE_INT32: _ClassVar[DType]
    D_TYPE_INT64: _ClassVar[DType]
    D_TYPE_UINT8: _ClassVar[DType]
    D_TYPE_BOOL: _ClassVar[DType]

class ActMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACT_MODE_UNSPECIFIED: _ClassVar[ActMode]
    ACT_MODE_SAMPLE: _ClassVar[ActMode]
    ACT_MODE_GREEDY_PI: _ClassVar[ActMode]
    ACT_MODE_GREEDY_Q: _ClassVar[ActMode]
    ACT_MODE_EPSILON_GREEDY: _ClassVar[ActMode]
D_TYPE_UNSPECIFIED: DType
D_TYPE_FLOAT32: DType
D_TYPE_FLOAT64: DType
D_TYPE_INT32: DType
D_TYPE_INT64: DType
D_TYPE_UINT8: DType
D_TYPE_BOOL: DType
ACT_MODE_UNSPECIFIED: ActMode
ACT_MODE_SAMPLE: ActMode
ACT_MODE_GREEDY_PI: ActMode
ACT_MODE_GREEDY_Q: ActMode
ACT_MODE_EPSILON_GREEDY: ActMode

class Tensor(_message.Message):
    __slots__ = ("shape", "dtype", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("obs", "actions", "rewards", "terminated", "truncated", "behavior_log_probs", "final_obs", "final_obs_index", "policy_version", "bce_labels", "aux_targets", "idempotency_key")
    OBS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOR_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    FINAL_OBS_FIELD_NUMBER: _ClassVar[int]
    FINAL_OBS_INDEX_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    BCE_LABELS_FIELD_NUMBER: _ClassVar[int]
    AUX_TARGETS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    obs: Tensor
    actions: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    behavior_log_probs: Tensor
    final_obs: Tensor
    final_obs_index: Tensor
    policy_version: int
    bce_labels: Tensor
    aux_targets: Tensor
    idempotency_key: StepKey
    def __init__(self, obs: _Optional[_Union[Tensor, _Mapping]] = ..., actions: _Optional[_Union[Tensor, _Mapping]] = ..., rewards: _Optional[_Union[Tensor, _Mapping]] = ..., terminated: _Optional[_Union[Tensor, _Mapping]] = ..., truncated: _Optional[_Union[Tensor, _Mapping]] = ..., behavior_log_probs: _Optional[_Union[Tensor, _Mapping]] = ..., final_obs: _Optional[_Union[Tensor, _Mapping]] = ..., final_obs_index: _Optional[_Union[Tensor, _Mapping]] = ..., policy_version: _Optional[int] = ..., bce_labels: _Optional[_Union[Tensor, _Mapping]] = ..., aux_targets: _Optional[_Union[Tensor, _Mapping]] = ..., idempotency_key: _Optional[_Union[StepKey, _Mapping]] = ...) -> None: ...

class StepKey(_message.Message):
    __slots__ = ("actor_id", "sequence")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    sequence: int
    def __init__(self, actor_id: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("losses", "grad_norm", "entropy", "approx_kl", "clip_fraction", "skipped", "skip_reason", "global_step", "policy_lag", "timings_ms", "updates_applied", "updates_skipped", "replayed", "checkpoint_step", "state_epoch", "warnings")
    class LossesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    LOSSES_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    APPROX_KL_FIELD_NUMBER: _ClassVar[int]
    CLIP_FRACTION_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SKIP_REASON_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    UPDATES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    STATE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    losses: _containers.ScalarMap[str, float]
    grad_norm: float
    entropy: float
    approx_kl: float
    clip_fraction: float
    skipped: bool
    skip_reason: str
    global_step: int
    policy_lag: int
    timings_ms: _containers.ScalarMap[str, float]
    updates_applied: int
    updates_skipped: int
    replayed: bool
    checkpoint_step: int
    state_epoch: int
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, losses: _Optional[_Mapping[str, float]] = ..., grad_norm: _Optional[float] = ..., entropy: _Optional[float] = ..., approx_kl: _Optional[float] = ..., clip_fraction: _Optional[float] = ..., skipped: _Optional[bool] = ..., skip_reason: _Optional[str] = ..., global_step: _Optional[int] = ..., policy_lag: _Optional[int] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., updates_applied: _Optional[int] = ..., updates_skipped: _Optional[int] = ..., replayed: _Optional[bool] = ..., checkpoint_step: _Optional[int] = ..., state_epoch: _Optional[int] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class StreamStepRequest(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: StepRequest
    def __init__(self, step: _Optional[_Union[StepRequest, _Mapping]] = ...) -> None: ...

class StreamStepResponse(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: StepResponse
    def __init__(self, step: _Optional[_Union[StepResponse, _Mapping]] = ...) -> None: ...

class InteractStart(_message.Message):
    __slots__ = ("actor_id", "first_sequence", "rollout_len", "group_envs", "synchronous")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_LEN_FIELD_NUMBER: _ClassVar[int]
    GROUP_ENVS_FIELD_NUMBER: _ClassVar[int]
    SYNCHRONOUS_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    first_sequence: int
    rollout_len: int
    group_envs: _containers.RepeatedScalarFieldContainer[int]
    synchronous: bool
    def __init__(self, actor_id: _Optional[str] = ..., first_sequence: _Optional[int] = ..., rollout_len: _Optional[int] = ..., group_envs: _Optional[_Iterable[int]] = ..., synchronous: _Optional[bool] = ...) -> None: ...

class InteractRequest(_message.Message):
    __slots__ = ("start", "group", "obs", "rewards", "terminated", "truncated", "final_obs", "final_obs_index", "bce_labels", "aux_targets")
    START_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OBS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    FINAL_OBS_FIELD_NUMBER: _ClassVar[int]
    FINAL_OBS_INDEX_FIELD_NUMBER: _ClassVar[int]
    BCE_LABELS_FIELD_NUMBER: _ClassVar[int]
    AUX_TARGETS_FIELD_NUMBER: _ClassVar[int]
    start: InteractStart
    group: int
    obs: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    final_obs: Tensor
    final_obs_index: Tensor
    bce_labels: Tensor
    aux_targets: Tensor
    def __init__(self, start: _Optional[_Union[InteractStart, _Mapping]] = ..., group: _Optional[int] = ..., obs: _Optional[_Union[Tensor, _Mapping]] = ..., rewards: _Optional[_Union[Tensor, _Mapping]] = ..., terminated: _Optional[_Union[Tensor, _Mapping]] = ..., truncated: _Optional[_Union[Tensor, _Mapping]] = ..., final_obs: _Optional[_Union[Tensor, _Mapping]] = ..., final_obs_index: _Optional[_Union[Tensor, _Mapping]] = ..., bce_labels: _Optional[_Union[Tensor, _Mapping]] = ..., aux_targets: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class InteractOutcome(_message.Message):
    __slots__ = ("sequence", "step", "error_code", "error_message")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    step: StepResponse
    error_code: int
    error_message: str
    def __init__(self, sequence: _Optional[int] = ..., step: _Optional[_Union[StepResponse, _Mapping]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class InteractResponse(_message.Message):
    __slots__ = ("group", "actions", "log_probs", "policy_version", "outcomes")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    group: int
    actions: Tensor
    log_probs: Tensor
    policy_version: int
    outcomes: _containers.RepeatedCompositeFieldContainer[InteractOutcome]
    def __init__(self, group: _Optional[int] = ..., actions: _Optional[_Union[Tensor, _Mapping]] = ..., log_probs: _Optional[_Union[Tensor, _Mapping]] = ..., policy_version: _Optional[int] = ..., outcomes: _Optional[_Iterable[_Union[InteractOutcome, _Mapping]]] = ...) -> None: ...

class ActRequest(_message.Message):
    __slots__ = ("obs", "mode", "epsilon")
    OBS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    obs: Tensor
    mode: ActMode
    epsilon: float
    def __init__(self, obs: _Optional[_Union[Tensor, _Mapping]] = ..., mode: _Optional[_Union[ActMode, str]] = ..., epsilon: _Optional[float] = ...) -> None: ...

class ActResponse(_message.Message):
    __slots__ = ("actions", "log_probs", "values", "policy_version")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    actions: Tensor
    log_probs: Tensor
    values: Tensor
    policy_version: int
    def __init__(self, actions: _Optional[_Union[Tensor, _Mapping]] = ..., log_probs: _Optional[_Union[Tensor, _Mapping]] = ..., values: _Optional[_Union[Tensor, _Mapping]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class CheckpointInfo(_message.Message):
    __slots__ = ("name", "global_step", "size_bytes", "created_unix", "save_ms", "commit_sequence")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    SAVE_MS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    global_step: int
    size_bytes: int
    created_unix: float
    save_ms: float
    commit_sequence: int
    def __init__(self, name: _Optional[str] = ..., global_step: _Optional[int] = ..., size_bytes: _Optional[int] = ..., created_unix: _Optional[float] = ..., save_ms: _Optional[float] = ..., commit_sequence: _Optional[int] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CheckpointInfo
    def __init__(self, checkpoint: _Optional[_Union[CheckpointInfo, _Mapping]] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RestoreResponse(_message.Message):
    __slots__ = ("checkpoint", "param_digest")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    PARAM_DIGEST_FIELD_NUMBER: _ClassVar[int]
    checkpoint: CheckpointInfo
    param_digest: str
    def __init__(self, checkpoint: _Optional[_Union[CheckpointInfo, _Mapping]] = ..., param_digest: _Optional[str] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointInfo]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[CheckpointInfo, _Mapping]]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("global_step", "backend", "device", "config_json", "param_digest", "inference_only", "step_queue_depth", "replay_size", "version", "kernel_abi_version", "auth_mode", "auth_token_set", "checkpoint_step", "state_epoch", "learning_rate", "lr_schedule", "env_steps_per_s", "open_streams", "seconds_since_step", "checkpoint_name", "checkpoint_age_s")
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    PARAM_DIGEST_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_ONLY_FIELD_NUMBER: _ClassVar[int]
    STEP_QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    REPLAY_SIZE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KERNEL_ABI_VERSION_FIELD_NUMBER: _ClassVar[int]
    AUTH_MODE_FIELD_NUMBER: _ClassVar[int]
    AUTH_TOKEN_SET_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    STATE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    LR_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_PER_S_FIELD_NUMBER: _ClassVar[int]
    OPEN_STREAMS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_NAME_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    global_step: int
    backend: str
    device: str
    config_json: str
    param_digest: str
    inference_only: bool
    step_queue_depth: int
    replay_size: int
    version: str
    kernel_abi_version: int
    auth_mode: str
    auth_token_set: bool
    checkpoint_step: int
    state_epoch: int
    learning_rate: float
    lr_schedule: str
    env_steps_per_s: float
    open_streams: int
    seconds_since_step: float
    checkpoint_name: str
    checkpoint_age_s: float
    def __init__(self, global_step: _Optional[int] = ..., backend: _Optional[str] = ..., device: _Optional[str] = ..., config_json: _Optional[str] = ..., param_digest: _Optional[str] = ..., inference_only: _Optional[bool] = ..., step_queue_depth: _Optional[int] = ..., replay_size: _Optional[int] = ..., version: _Optional[str] = ..., kernel_abi_version: _Optional[int] = ..., auth_mode: _Optional[str] = ..., auth_token_set: _Optional[bool] = ..., checkpoint_step: _Optional[int] = ..., state_epoch: _Optional[int] = ..., learning_rate: _Optional[float] = ..., lr_schedule: _Optional[str] = ..., env_steps_per_s: _Optional[float] = ..., open_streams: _Optional[int] = ..., seconds_since_step: _Optional[float] = ..., checkpoint_name: _Optional[str] = ..., checkpoint_age_s: _Optional[float] = ...) -> None: ...

class UpdateHyperparamsRequest(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, float]
    def __init__(self, values: _Optional[_Mapping[str, float]] = ...) -> None: ...

class UpdateHyperparamsResponse(_message.Message):
    __slots__ = ("config_json",)
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    config_json: str
    def __init__(self, config_json: _Optional[str] = ...) -> None: ...
