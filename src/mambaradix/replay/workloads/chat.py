"""Chat messages to token ids with a real tokenizer, keeping exact prefixes.

The tokenizer is Mistral's SentencePiece v7 model (32,768 ids) shipped inside
the PyPI package `mistral-common` (optional extra `text`). The template is
Mistral's v7 instruct template, applied one message at a time::

    <s>[SYSTEM_PROMPT]system[/SYSTEM_PROMPT][INST]user[/INST]answer</s>[INST]...

Encoding each message on its own and concatenating makes every LLM call's
prompt an exact token prefix of the next one's (prompt + answer + next user
message), which is what a prefix cache sees from a real serving stack. For
conversations of system/user/assistant text this is token-for-token what
`MistralTokenizer.encode_chat_completion` produces (checked in the tests):
consecutive user messages are joined with a blank line and an answer loses
trailing spaces, as there. Two extensions have no exact counterpart there,
because mistral-common drops tool calls and results that precede the last user
message (which would break the prefix property):

* an assistant tool call is encoded after its text as
  `[TOOL_CALLS][{"name": ..., "arguments": ...}]` before `</s>`;
* a tool result is encoded as `[TOOL_RESULTS]content[/TOOL_RESULTS]`.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Literal, NamedTuple

Role = Literal["system", "user", "assistant", "tool"]
TOKENIZER_FILE = "mistral_instruct_tokenizer_241114.model.v7"
INSTALL_HINT = "text workloads need the 'text' extra: pip install 'mambaradix[text]'"


class ToolCall(NamedTuple):
    name: str
    arguments: str  # JSON text, as the model emitted it


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()


class Encoded(NamedTuple):
    """A whole conversation as one token stream.

    `calls[i] = (start, end)`: assistant message i occupies `tokens[start:end]`
    (its answer, `</s>` included); its prompt is `tokens[:start]`.
    """

    tokens: array[int]
    calls: list[tuple[int, int]]


class ChatTokenizer:
    """Mistral v7 chat template over mistral-common's SentencePiece tokenizer."""

    def __init__(self, tokenizer_file: str = TOKENIZER_FILE) -> None:
        try:
            from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer
        except ImportError as e:
            raise ImportError(f"{INSTALL_HINT} ({e})") from e
        path = resources.files("mistral_common") / "data" / tokenizer_file
        self.file = tokenizer_file
        self._tok = SentencePieceTokenizer(str(path))
        special = self._tok.get_special_token
        self.bos, self.eos = self._tok.bos_id, self._tok.eos_id
        self.inst, self.end_inst = special("[INST]"), special("[/INST]")
        self.system, self.end_system = special("[SYSTEM_PROMPT]"), special("[/SYSTEM_PROMPT]")
        self.tool_calls = special("[TOOL_CALLS]")
        self.tool_results = special("[TOOL_RESULTS]")
        self.end_tool_results = special("[/TOOL_RESULTS]")
        self.vocab_size = self._tok.n_words

    def encode_text(self, text: str) -> list[int]:
        """Plain text to token ids (no BOS/EOS)."""
        return self._tok.encode(text, bos=False, eos=False)

    def encode_message(self, m: Message) -> list[int]:
        """One message's tokens in the v7 template."""
        if m.role == "system":
            return [self.system, *self.encode_text(m.content), self.end_system]
        if m.role == "user":
            return [self.inst, *self.encode_text(m.content), self.end_inst]
        if m.role == "tool":
            return [self.tool_results, *self.encode_text(m.content), self.end_tool_results]
        toks = self.encode_text(m.content.rstrip(" ")) if m.content else []
        if m.tool_calls:
            calls = [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]
            toks += [self.tool_calls, *self.encode_text(json.dumps(calls, ensure_ascii=False))]
        return [*toks, self.eos]

    def encode(self, messages: Sequence[Message]) -> Encoded:
        """Encode a conversation; consecutive user messages are joined first."""
        tokens = array("q", [self.bos])
        calls: list[tuple[int, int]] = []
        for m in merge_user_runs(messages):
            start = len(tokens)
            tokens.extend(self.encode_message(m))
            if m.role == "assistant":
                calls.append((start, len(tokens)))
        return Encoded(tokens, calls)


def merge_user_runs(messages: Sequence[Message]) -> list[Message]:
    """Join runs of consecutive user messages with a blank line (as mistral-common)."""
    out: list[Message] = []
    for m in messages:
        if out and m.role == "user" and out[-1].role == "user":
            out[-1] = Message("user", out[-1].content + "\n\n" + m.content)
        else:
            out.append(m)
    return out


@lru_cache(maxsize=2)
def chat_tokenizer(tokenizer_file: str = TOKENIZER_FILE) -> ChatTokenizer:
    """A shared ChatTokenizer (loading one takes about 0.4 s)."""
    return ChatTokenizer(tokenizer_file)
