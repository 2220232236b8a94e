"""`PairTrainer`: the offline loop (`offline.OfflineTrainer`) over preference pairs, shared by DPO and
the reward model: rows {prompt|messages, chosen, rejected} encoded once, truncations counted."""

from __future__ import annotations

from .offline import OfflineTrainer

class PairTrainer(OfflineTrainer):
    """An offline trainer over preference pairs {prompt|messages, chosen, rejected} (DPO, reward
    models): rows encoded once with `self.codec`, each batch chosen rows first, then rejected."""

    def encode(self, path: str) -> list:
        from ..tasks.preference_data import TruncationCounter, read_preference
        from .text_batches import encode_preferences

        counter = TruncationCounter()
        pairs = encode_preferences(read_preference(path), self.codec, self.config.data.max_length, counter)
        self.data_notes.append(f"{path}: {counter}")
        return pairs

    def collate(self, rows):
        from .text_batches import pair_batch

        return pair_batch(rows, self.pad_id, self.device)
