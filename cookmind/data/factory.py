"""``DatasetFactory.load``: open a store and wrap it in the dataset for its train type."""

from __future__ import annotations

import inspect

from cookmind.data.dpo_dataset import DPODataset
from cookmind.data.grpo_dataset import GRPODataset
from cookmind.data.seq_dataset import SeqDataset
from cookmind.data.sft_dataset import SFTDataset
from cookmind.store import StoreError, TokenStore


class DatasetFactory:
    """Registry ``train_type -> dataset class`` for seq, sft, dpo and grpo."""

    _datasets = {"seq": SeqDataset, "sft": SFTDataset, "dpo": DPODataset, "grpo": GRPODataset}

    @classmethod
    def load(
        cls,
        train_type: str,
        load_path,
        window_size: int,
        stride: int | None = None,
        storage_type: str | None = None,
        tokenizer_fingerprint: str | None = None,
        tokenizer_path: str | None = None,
        tokenizer_framing: dict | None = None,
        source: str | None = None,
        **options,
    ):
        """Open the store at ``load_path`` and return its ``train_type`` dataset.

        ``stride`` applies to seq windows only. ``options`` go to the dataset class
        (seq: ``doc_mask``; sft: ``packing``, ``pad_to_window``, ``pad_id``); an unknown
        option is an error naming the ones that exist. With ``tokenizer_fingerprint`` a store
        packed by another tokenizer is refused (the error names ``tokenizer_path`` too), and with
        ``tokenizer_framing`` one whose documents open or end otherwise (``TokenStore.check_tokenizer``).
        ``source`` names where the caller took ``load_path`` from (a flag, a setting: ``--val-data (data.val_path)``);
        a refusal then opens with it.
        """
        if train_type not in cls._datasets:
            raise ValueError(f"unknown train type {train_type!r}; choose one of {sorted(cls._datasets)}")
        try:
            store = TokenStore(load_path, storage_type)
            if store.train_type != train_type:
                raise StoreError(
                    f"{load_path} is a {store.train_type!r} store, not {train_type!r}; "
                    f"pack it with `cookmind pack --train-type {train_type}`"
                )
            if tokenizer_fingerprint is not None or tokenizer_framing is not None:
                store.check_tokenizer(tokenizer_fingerprint, tokenizer_path, tokenizer_framing)
        except StoreError as exc:
            if source is None:
                raise
            raise StoreError(f"{source}: {exc}") from exc
        klass = cls._datasets[train_type]
        allowed = [p for p in inspect.signature(klass).parameters if p not in ("store", "window_size")]
        unknown = sorted(set(options) - set(allowed))
        if stride is not None:
            if "stride" not in allowed:
                raise ValueError(f"stride applies to seq windows only, not to {train_type!r}")
            options["stride"] = stride
        if unknown:
            raise ValueError(f"unknown {train_type} dataset option(s) {unknown}; allowed: {allowed}")
        return klass(store, window_size, **options)
