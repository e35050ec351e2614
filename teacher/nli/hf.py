"""Stages D and E with any Hugging Face NLI cross-encoder (`AutoModelForSequenceClassification`)."""

from __future__ import annotations

import json
import logging
import re
import threading
import unicodedata
from collections.abc import Sequence

from stepgap.models import (
    check_model_ref,
    display_ref,
    explain_load_errors,
    resolve_device,
    resolve_dtype,
    stand_in_note,
)
from stepgap.schema import NLIProbs
from stepgap.tree import NLIError, Pair

from .base import NLIBackend, NLIOptions

log = logging.getLogger(__name__)

DEFAULT_NLI_MODEL = "MoritzLaurer/DeBERTa-v3-base-mnli-fever-anli"
NLI_LABELS = ("entailment", "neutral", "contradiction")
# A pair that must entail finds the entailment column of a model whose id2label says nothing;
# a pair that must contradict then tells contradiction from neutral among the other two.
PROBE_ENTAIL: Pair = ("A cat is an animal.", "A cat is an animal.")
PROBE_CONTRADICT: Pair = ("A cat is an animal.", "A cat is not an animal.")


def labels_from_id2label(id2label: dict[int, str]) -> dict[str, int] | None:
    """Map entailment/neutral/contradiction to output columns, if id2label names all three."""
    found: dict[str, int] = {}
    for idx, name in id2label.items():
        low = str(name).lower()
        for label in NLI_LABELS:
            if low.startswith(label[:7]):  # 'entailment', 'entail', 'contradiction', 'contradict'
                found[label] = int(idx)
    return found if len(found) == 3 and len(set(found.values())) == 3 else None


def check_pair_markers(tokenizer: object, ref: str) -> None:
    """A cross-encoder reads a pair as it was trained to: with its class and separator tokens.
    transformers 5.3 loads DeBERTa-v3's tokenizer without them (a pair comes out as the two
    texts run together), and every NLI score would then be wrong without a word: refuse it."""
    import transformers

    ids = tokenizer("premise", "hypothesis")["input_ids"]
    marks = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id}
    missing = [f"[{name.upper()}]" for name, i in marks.items() if i is not None and i not in ids]
    if missing:
        raise ValueError(
            f"{ref}: transformers {transformers.__version__} encodes an NLI pair without "
            f"{' and '.join(missing)}, so every score would be wrong; use the transformers "
            "stepgap requires (pip install -U 'transformers>=5.5.3')"
        )


class HFNLI(NLIBackend):
    """A cross-encoder by hub id or local path; batched and length-sorted.

    Truncation cuts the premise only, never the hypothesis. Column order comes from the
    config's id2label when it names the three labels, otherwise from the probe pairs.
    """

    options_class = NLIOptions

    @classmethod
    def from_spec(cls, arg: str, options: NLIOptions) -> HFNLI:
        """`hf:ID_OR_PATH` (or a bare hub id or path) on `options.device`."""
        return cls(arg, device=options.device)

    def __init__(
        self,
        model: str = DEFAULT_NLI_MODEL,
        *,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 32,
        max_length: int = 512,
        revision: str | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification

        check_model_ref(model)
        self.name = f"hf:{model}"
        self.model_id = model
        self.device = resolve_device(device, "the NLI model")
        self.batch_size = batch_size
        self.max_length = max_length
        self._load_tokenizer(model, revision=revision)
        with explain_load_errors(model, "NLI model"):
            self.model = AutoModelForSequenceClassification.from_pretrained(
                model,
                revision=revision,
                dtype=resolve_dtype(dtype, self.device),
                trust_remote_code=False,
            ).to(self.device)
        self.model.eval()
        if self.model.config.num_labels != 3:
            raise ValueError(
                f"{model} has {self.model.config.num_labels} output labels; an NLI model needs 3"
            )
        self._torch = torch
        columns = labels_from_id2label(self.model.config.id2label)
        if columns is None:
            columns = self._probe_columns()
            log.info("%s: id2label is uninformative; probe set columns %s", model, columns)
        self.columns = columns

    @property
    def provenance(self) -> dict[str, str | None]:
        kind = self.name.split(":", 1)[0]
        return {
            "spec": f"{kind}:{display_ref(self.model_id)}",
            "note": stand_in_note(self.config),
        }

    @property
    def config(self) -> object:
        return self.model.config

    def _load_tokenizer(self, ref: str, **kwargs: object) -> None:
        """The tokenizer, the special tokens to defang, and the lock every call takes: a fast
        tokenizer changes its truncation and padding settings per call, so two threads sharing
        it at once fail ("Already borrowed"); the reward server and veRL's reward loop do."""
        from transformers import AutoTokenizer

        with explain_load_errors(ref, "NLI tokenizer"):
            self.tokenizer = AutoTokenizer.from_pretrained(ref, **kwargs)
        check_pair_markers(self.tokenizer, ref)
        self._specials = special_token_pattern(self.tokenizer)
        self._nfkc = lacks_sentencepiece_normalization(self.tokenizer)
        self._tokenizer_lock = threading.Lock()

    def _tokenize(self, premises: list[str], hypotheses: list[str], **kwargs: object) -> dict:
        with self._tokenizer_lock:
            return self.tokenizer(premises, hypotheses, split_special_tokens=True, **kwargs)

    def _encode(self, pairs: Sequence[Pair], tensors: str = "pt") -> dict:
        """Tokenize pairs, truncating the premise only.

        Text that spells a special token (`[SEP]`, `[CLS]`, ...) is tokenized as plain text:
        a retrieved snippet or a policy's claim must not move the premise/hypothesis boundary.
        `split_special_tokens` is not enough: DeBERTa-v3's fast tokenizer still reads `[SEP]`
        as the separator (its SentencePiece vocabulary holds the piece), so such text is broken
        apart first (`[SEP]` -> `[ SEP]`), as the slow tokenizer would split it.
        """
        premises = [self._defang(p) for p, _ in pairs]
        hypotheses = [self._defang(h) for _, h in pairs]
        try:
            return self._tokenize(
                premises,
                hypotheses,
                padding=True,
                truncation="only_first",
                max_length=self.max_length,
                return_tensors=tensors,
            )
        except Exception as exc:  # the hypothesis alone is longer than max_length
            raise NLIError(f"cannot fit the pair into {self.max_length} tokens: {exc}") from exc

    def _token_lengths(self, pairs: Sequence[Pair]) -> list[int]:
        """Tokens each pair takes once truncated to max_length (no padding): the batching key.
        `longest_first` never raises, and gives the same length as the premise-only cut
        wherever that cut is possible (where not, `_encode` raises for the batch)."""
        enc = self._tokenize(
            [self._defang(p) for p, _ in pairs],
            [self._defang(h) for _, h in pairs],
            truncation="longest_first",
            max_length=self.max_length,
        )
        return [len(ids) for ids in enc["input_ids"]]

    def _defang(self, text: str) -> str:
        if self._nfkc:
            text = unicodedata.normalize("NFKC", text)
        if self._specials is None:
            return text
        return self._specials.sub(lambda m: f"{m.group()[0]} {m.group()[1:]}", text)

    def _logits(self, pairs: Sequence[Pair]):
        """Raw logits (batch, 3) as a float32 torch tensor, in the model's column order."""
        torch = self._torch
        enc = {k: v.to(self.device) for k, v in self._encode(pairs).items()}
        with torch.inference_mode():
            return self.model(**enc).logits.float()

    def _probe_columns(self) -> dict[str, int]:
        torch = self._torch
        probs = torch.softmax(self._logits([PROBE_ENTAIL, PROBE_CONTRADICT]), dim=-1).cpu()
        ent = int(probs[0].argmax())
        if float(probs[0, ent]) < 0.5:
            log.warning("NLI probe: the entailment pair scored only %.2f", float(probs[0, ent]))
        rest = [i for i in range(3) if i != ent]
        con = max(rest, key=lambda i: float(probs[1, i]))
        neu = next(i for i in rest if i != con)
        return {"entailment": ent, "neutral": neu, "contradiction": con}

    def predict(self, pairs: Sequence[Pair]) -> list[NLIProbs]:
        """Probabilities per pair, in input order; identical pairs are scored once."""
        torch = self._torch
        unique = list(dict.fromkeys(pairs))
        # Batches of pairs of like token length, each padded to its own longest pair, waste
        # little compute on padding (characters are a poorer guide: ~7% more padded tokens).
        lengths = self._token_lengths(unique)
        order = sorted(range(len(unique)), key=lengths.__getitem__)
        scored: dict[Pair, NLIProbs] = {}
        for start in range(0, len(order), self.batch_size):
            batch = [unique[i] for i in order[start : start + self.batch_size]]
            probs = torch.softmax(self._logits(batch), dim=-1).cpu().tolist()
            for pair, row in zip(batch, probs, strict=True):
                scored[pair] = NLIProbs(**{lab: row[col] for lab, col in self.columns.items()})
        return [scored[p] for p in pairs]


def lacks_sentencepiece_normalization(tokenizer) -> bool:
    """Whether a SentencePiece (Unigram) tokenizer was rebuilt without SentencePiece's NFKC
    normalization, which the model was trained with. transformers 5 (up to 5.19 at least;
    5.25 keeps SentencePiece's own) builds a DeBERTa-v3 tokenizer from its `spm.model` with NFC
    only: a no-break space, a ligature or a full-width letter (common in Wikipedia evidence)
    then becomes pieces the model never saw, so stepgap applies NFKC to the text itself."""
    from tokenizers.models import Unigram

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow tokenizer runs SentencePiece itself, its normalization included
        return False
    if not isinstance(backend.model, Unigram):
        return False
    kinds: set[str] = set()  # the normalizer alone as JSON: not the whole vocabulary
    pending = [json.loads(backend.normalizer.__getstate__()) if backend.normalizer else None]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            kinds.add(str(node.get("type")))
            pending.extend(node.get("normalizers") or [])
    return not kinds & {"NFKC", "NFKD", "Precompiled"}


def special_token_pattern(tokenizer) -> re.Pattern[str] | None:
    """A pattern matching the spelled-out special tokens of `tokenizer` (longest first)."""
    tokens = sorted((t for t in tokenizer.all_special_tokens if len(t) > 1), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tokens))) if tokens else None
