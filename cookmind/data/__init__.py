"""Datasets for every train type over token stores, their collate functions, and an exactly
resumable distributed sampler."""

from cookmind.data.collate import collate_for
from cookmind.data.doc_mask import doc_attention_mask
from cookmind.data.dpo_dataset import DPODataset
from cookmind.data.factory import DatasetFactory
from cookmind.data.grpo_dataset import GRPODataset
from cookmind.data.loader import ResumableDataLoader, build_dataloader
from cookmind.data.sampler import ResumableDistributedSampler
from cookmind.data.seq_dataset import SeqDataset
from cookmind.data.sft_dataset import IGNORE_INDEX, SFTDataset

__all__ = [
    "IGNORE_INDEX",
    "DPODataset",
    "DatasetFactory",
    "GRPODataset",
    "ResumableDataLoader",
    "ResumableDistributedSampler",
    "SFTDataset",
    "SeqDataset",
    "build_dataloader",
    "collate_for",
    "doc_attention_mask",
]
