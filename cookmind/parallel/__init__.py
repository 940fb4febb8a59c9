"""Distributed training written here: process-group setup, bucketed DDP, sharded optimizer state."""

from .bucket_plan import plan_buckets
from .compile_blocks import compile_blocks, find_blocks
from .data_parallel import KINDS, finish_gradient_synchronization, no_sync, unwrap_model, wrap_data_parallel
from .ddp import DDP
from .grad_bucket import GradBucket
from .process_group import DistInfo, destroy_distributed, find_free_port, init_distributed
from .sharded_optimizer import ShardedOptimizer

__all__ = [
    "DDP", "ShardedOptimizer", "DistInfo", "init_distributed", "destroy_distributed", "find_free_port",
    "wrap_data_parallel", "no_sync", "finish_gradient_synchronization", "unwrap_model", "KINDS",
    "GradBucket", "plan_buckets", "compile_blocks", "find_blocks",
]
