"""Distributed training written here: process-group setup, ``parallelize`` (activation checkpointing, compile,
bucketed DDP or FSDP2), sharded optimizer state, and ``unwrap`` to get the plain model back."""

from cookmind.model.wrappers import unwrap

from .activation_checkpointing import apply_activation_checkpointing
from .bucket_plan import plan_buckets
from .compile_blocks import compile_blocks, find_blocks
from .ddp import DDP
from .fsdp import copy_shards, gathered_weights, is_sharded, reshard_all, shard_model
from .grad_bucket import GradBucket
from .parallelize import (
    finish_gradient_sync,
    fsdp_param_dtype,
    no_sync,
    parallelize,
    shard_frozen,
    wrap_data_parallel,
)
from .process_group import DistInfo, all_reduce_flag, barrier, destroy_distributed, init_distributed
from .sharded_optimizer import ShardedOptimizer

__all__ = [
    "DDP",
    "DistInfo",
    "GradBucket",
    "ShardedOptimizer",
    "all_reduce_flag",
    "apply_activation_checkpointing",
    "barrier",
    "compile_blocks",
    "copy_shards",
    "destroy_distributed",
    "find_blocks",
    "finish_gradient_sync",
    "fsdp_param_dtype",
    "gathered_weights",
    "init_distributed",
    "is_sharded",
    "no_sync",
    "parallelize",
    "plan_buckets",
    "reshard_all",
    "shard_frozen",
    "shard_model",
    "unwrap",
    "wrap_data_parallel",
]
