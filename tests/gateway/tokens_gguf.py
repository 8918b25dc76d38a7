"""Build a Hugging Face `tokenizer.json` from a GGUF's own vocabulary, offline (tests only).

Reads pieces, scores and token kinds through llama-cpp-python (vocab only, no weights) and makes
the SentencePiece-BPE equivalent with the `tokenizers` library: merges ordered by the merged piece's
score, byte fallback, user-defined and control pieces as added tokens, BOS prepended. Never downloads.
"""

from __future__ import annotations

from pathlib import Path

CONTROL, USER_DEFINED = 8, 16  # llama_token_attr bits


def build_tokenizer_json(gguf: Path, out: Path) -> Path:
    """`out` (cached: rebuilt only when missing)."""
    if out.exists() and out.stat().st_size > 0:
        return out
    import llama_cpp
    from tokenizers import AddedToken, Tokenizer, normalizers, processors
    from tokenizers.models import BPE

    llm = llama_cpp.Llama(str(gguf), vocab_only=True, verbose=False)
    vocab_h = llama_cpp.llama_model_get_vocab(llm.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab_h)
    vocab: dict[str, int] = {}
    scores: dict[str, float] = {}
    added: list[AddedToken] = []
    for i in range(n):
        piece = llama_cpp.llama_vocab_get_text(vocab_h, i).decode("utf-8", "replace")
        attr = llama_cpp.llama_vocab_get_attr(vocab_h, i)
        if piece in vocab:
            continue
        vocab[piece] = i
        scores[piece] = llama_cpp.llama_vocab_get_score(vocab_h, i)
        if attr & (CONTROL | USER_DEFINED):
            added.append(AddedToken(piece, special=bool(attr & CONTROL), normalized=False))
    special = {a.content for a in added}
    merges = []
    for piece, pid in vocab.items():
        if len(piece) < 2 or piece in special:
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((-scores[piece], pid, vocab[left], vocab[right], left, right))
    merges.sort()
    tok = Tokenizer(BPE(vocab, [(m[4], m[5]) for m in merges], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.add_tokens(added)
    bos = llama_cpp.llama_vocab_bos(vocab_h)
    bos_piece = llama_cpp.llama_vocab_get_text(vocab_h, bos).decode()
    tok.post_processor = processors.TemplateProcessing(single=f"{bos_piece} $A", special_tokens=[(bos_piece, bos)])
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    tok.save(str(partial))
    partial.replace(out)
    return out
