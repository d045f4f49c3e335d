"""Instruction (SFT) records rendered into text segments that say which part carries loss.

A rendered record is a list of ``(text, train)`` segments: prompt parts have ``train=False`` and get
loss mask 0; response parts have ``train=True``. The tokenizer encodes segments one by one so the
mask lands exactly on token boundaries, and the packer keeps the record as one document.
"""

from __future__ import annotations

from typing import Any

from pipeline.documents import is_blank

DEFAULT_INSTRUCTION_TEMPLATE = "### Instruction:\n{instruction}\n\n{input_block}### Response:\n"
DEFAULT_CHAT_TEMPLATE = "<|{role}|>\n"

Segments = list[tuple[str, bool]]


class RecordError(ValueError):
    """A record that cannot be rendered; the message is the reject reason."""


def render_instruction(record: dict[str, Any], template: str | None = None) -> Segments:
    """``{instruction, input?, output}`` -> prompt (no loss) + output (loss)."""
    instruction, output = record.get("instruction"), record.get("output")
    if not isinstance(instruction, str) or is_blank(instruction):
        raise RecordError("missing_instruction")
    if not isinstance(output, str) or is_blank(output):
        raise RecordError("missing_output")
    extra = record.get("input") or ""
    if not isinstance(extra, str):
        raise RecordError("bad_input_field")
    input_block = "" if is_blank(extra) else f"### Input:\n{extra}\n\n"
    prompt = (template or DEFAULT_INSTRUCTION_TEMPLATE).format(
        instruction=instruction, input=extra, input_block=input_block
    )
    return [(prompt, False), (output, True)]


def render_chat(record: dict[str, Any], template: str | None = None) -> Segments:
    """``{messages: [{role, content}]}`` -> role headers and user/system turns without loss,
    assistant turns with loss."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RecordError("missing_messages")
    header = template or DEFAULT_CHAT_TEMPLATE
    segments: Segments = []
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("content"), str):
            raise RecordError("bad_message")
        role = msg.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise RecordError("bad_role")
        segments.append((header.format(role=role), False))
        segments.append((msg["content"] + "\n", role == "assistant"))
    if not any(train for _, train in segments):
        raise RecordError("no_assistant_turn")
    return segments


def render(record: dict[str, Any], fmt: str, template: str | None = None) -> Segments:
    if fmt == "instruction":
        return render_instruction(record, template)
    if fmt == "chat":
        return render_chat(record, template)
    raise ValueError(f"not an instruction format: {fmt}")
