#!/usr/bin/env python3
"""Tokenizes conversations for supervised fine-tuning (SFT) with a Hugging Face model's own
tokenizer and chat template into a Megatron indexed dataset plus the per-token loss mask that
says which tokens are learned, as NeMo AutoModel's ChatDataset and
ColumnMappedTextInstructionDataset prepare them (nemo_automodel/components/datasets/llm/).

    .venv/bin/python tools/scripts/hf_sft_tokenize.py --model=hf/Qwen2.5-0.5B-Instruct \\
        --output_prefix=data/chat chats.jsonl
    .venv/bin/python tools/scripts/hf_sft_tokenize.py --model=hf/Llama-3.2-1B-Instruct \\
        --output_prefix=data/qa --column_mapping=context=definition,question=inputs,answer=targets qa.jsonl

Rows (one JSON object per line of each FILE, files in order):
  {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]}  (OpenAI)
  {"conversations": [{"from": "system"|"human"|"gpt", "value": "..."}, ...]}  (ShareGPT: human is
      user, gpt is assistant)
  with --column_mapping=DEST=COLUMN,... (AutoModel's column_mapping: DEST is context, question or
  answer; answer and one or both of the others): the answer column and the others' columns, strings.
      With a chat template the row is the conversation [system: context or "", user: question or
      "", assistant: answer], as AutoModel renders it. Without one it is AutoModel's plain
      prompt/completion: the text `context question ` (the present ones, each followed by a space)
      then the answer, tokenized with the tokenizer's special tokens, EOS appended unless it is last;
      the prompt's tokens (a BOS counted when the tokenizer adds one) are not learned, the rest are.

A conversation is rendered and tokenized by transformers' apply_chat_template (the model's chat
template, or --chat_template=FILE: the template's text, or a tokenizer_config.json holding one).
Which tokens are learned (AutoModel's format_chat_template, in this order):
  1. --train_on_all: every token.
  2. The template has {% generation %} blocks: the tokens transformers marks in
     return_assistant_tokens_mask=True.
  3. Otherwise, for every assistant message k, the tokens between the render of messages[:k] and
     that of messages[:k+1] (its role header included), both without a generation prompt. Each
     prefix render must reproduce the start of the full render (one trailing EOS may differ): a
     template that rewrites earlier turns (Qwen3's drops the <think> of earlier answers) is
     refused, naming the template and the row.

Output, one document of one sequence per conversation, in row order:
  PREFIX.bin, PREFIX.idx       the token ids (uint16 below 65500 ids, else int32; Megatron's
                               MMIDIDX version 1, megatron_indexed.py);
  PREFIX_loss_mask.bin, .idx   the same layout in uint8: 1 where a token is learned, else 0 (the
                               token's own mask, not yet shifted: the label of input position i is
                               token i+1, learned iff its mask is 1). Same document count and
                               sizes as the tokens; sampling/conversation_dataset.h reads both and
                               checks that they agree. Written last, so its .idx marks a finished run;
  PREFIX.tokenizer.json        the record hf_tokenize.py writes (append_eod false).

A bad row (not JSON, not an object, no messages, a message without a string role and content, an
unknown role, no assistant turn, an empty line, a row the template raises on, or no learned
token) is an error naming the file and line; --skip_invalid skips it, names it on stderr, and
counts it in the summary. The summary: conversations, tokens, learned tokens, rows skipped.

Exit status: 0 written; 1 a bad row, a refused template, an unreadable file or no conversation;
2 bad usage. Needs transformers (tools/bootstrap.sh puts it in .venv); reads the tokenizer offline.
"""

import argparse
import json
import re
import sys

# AutoModel's test for a template with assistant masks (formatting_utils.GENERATION_REGEX).
_GENERATION = re.compile(r"\{%-?\s+generation\s+-?%\}")
_OPENAI_ROLES = ("system", "user", "assistant", "tool")
_SHAREGPT_ROLES = {"system": "system", "human": "user", "gpt": "assistant"}
_COLUMNS = ("context", "question", "answer")


class BadRow(Exception):
    """The row cannot be a training conversation; skippable with --skip_invalid."""


class TemplateRefused(Exception):
    """The chat template cannot mark the learned tokens; never skipped."""


def parse_column_mapping(text: str) -> dict:
    """--column_mapping=DEST=COLUMN,... as AutoModel's column_mapping {dest: column}, checked as
    ColumnMappedTextInstructionDataset checks it."""
    mapping = {}
    for item in text.split(","):
        dest, sep, column = item.partition("=")
        if not sep or not column or dest not in _COLUMNS or dest in mapping:
            raise ValueError(f"--column_mapping={text}: '{item}' is not DEST=COLUMN with DEST one of "
                             f"{', '.join(_COLUMNS)}, each at most once")
        mapping[dest] = column
    if "answer" not in mapping or len(mapping) < 2:
        raise ValueError(f"--column_mapping={text} must map answer and context, question or both")
    return mapping


def _messages(row: dict) -> list:
    """The row's conversation as OpenAI messages [{"role", "content"}]."""
    if "messages" in row:
        turns, role_key, text_key, roles = row["messages"], "role", "content", {r: r for r in _OPENAI_ROLES}
    elif "conversations" in row:
        turns, role_key, text_key, roles = row["conversations"], "from", "value", _SHAREGPT_ROLES
    else:
        raise BadRow("no 'messages' (OpenAI) or 'conversations' (ShareGPT)")
    if not isinstance(turns, list) or not turns:
        raise BadRow("no messages (an empty or non-list conversation)")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get(role_key), str) or \
                not isinstance(turn.get(text_key), str):
            raise BadRow(f"message {i} has no string '{role_key}' and '{text_key}'")
        if turn[role_key] not in roles:
            raise BadRow(f"message {i}: unknown {role_key} '{turn[role_key]}' "
                         f"(allowed: {', '.join(roles)})")
        messages.append({"role": roles[turn[role_key]], "content": turn[text_key]})
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRow("no assistant turn")
    return messages


def _columns(row: dict, mapping: dict) -> dict:
    """The mapped columns {dest: text} of a prompt/completion row."""
    values = {}
    for dest, column in mapping.items():
        value = row.get(column)
        if not isinstance(value, str) or (dest == "answer" and not value):
            raise BadRow(f"no {'non-empty ' if dest == 'answer' else ''}string column '{column}' ({dest})")
        values[dest] = value
    return values


class Renderer:
    """Turns rows into (ids, mask) with one tokenizer and template, as the module doc says."""

    def __init__(self, tokenizer, template, template_name: str, column_mapping, train_on_all: bool):
        self.tokenizer, self.template, self.template_name = tokenizer, template, template_name
        self.column_mapping = column_mapping
        if train_on_all:
            self.learned_by = "all"
        elif template is None:
            self.learned_by = "prompt"
        else:
            self.learned_by = "generation" if _GENERATION.search(template) else "prefixes"

    def __call__(self, row, where: str):
        if not isinstance(row, dict):
            raise BadRow("not a JSON object")
        if self.template is None:
            ids, mask = self._prompt_completion(_columns(row, self.column_mapping))
        else:
            if self.column_mapping is not None:
                c = _columns(row, self.column_mapping)
                messages = [{"role": "system", "content": c.get("context", "")},
                            {"role": "user", "content": c.get("question", "")},
                            {"role": "assistant", "content": c["answer"]}]
            else:
                messages = _messages(row)
            ids, mask = self._chat(messages, where)
        if not any(mask):
            raise BadRow("no learned token")
        return ids, mask

    def describe(self) -> str:
        """How tokens are learned, for the summary."""
        return {"all": "every token (--train_on_all)", "prompt": "the answers of prompt/completion rows",
                "generation": "the template's {% generation %} blocks",
                "prefixes": "comparing renders of message prefixes"}[self.learned_by]

    def _render(self, messages, assistant_mask: bool = False):
        try:
            return self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=True,
                                                      return_dict=True, add_generation_prompt=False,
                                                      return_assistant_tokens_mask=assistant_mask)
        except Exception as e:  # jinja2's TemplateError, or raise_exception() in the template
            raise BadRow(f"{self.template_name} refused it ({type(e).__name__}: {e})")

    def _chat(self, messages, where: str):
        rendered = self._render(messages, assistant_mask=self.learned_by == "generation")
        ids = list(rendered["input_ids"])
        if self.learned_by == "all":
            return ids, [1] * len(ids)
        if self.learned_by == "generation":
            return ids, [int(bool(m)) for m in rendered["assistant_masks"]]
        return ids, self._prefix_mask(messages, ids, where)

    def _prefix_mask(self, messages, ids, where: str):
        eos = self.tokenizer.eos_token_id
        lengths = {len(messages): len(ids)}

        def rendered_length(k: int) -> int:
            if k not in lengths:
                prefix = list(self._render(messages[:k])["input_ids"])
                n = len(prefix)
                if n > len(ids) or (prefix != ids[:n] and not (
                        n > 1 and eos is not None and prefix[-1] == eos and prefix[:-1] == ids[:n - 1])):
                    raise TemplateRefused(
                        f"{self.template_name}: the render of the first {k} messages of {where} is not a "
                        "prefix of the whole conversation's render (the template rewrites earlier turns), "
                        "so the learned tokens cannot be found by comparing prefixes; use a template with "
                        "{% generation %} blocks (--chat_template) or --train_on_all")
                lengths[k] = n
            return lengths[k]

        mask = [0] * len(ids)
        for k, message in enumerate(messages):
            if message["role"] == "assistant":
                for i in range(rendered_length(k), rendered_length(k + 1)):
                    mask[i] = 1
        return mask

    def _prompt_completion(self, columns: dict):
        t = self.tokenizer
        prompt = " ".join([columns[c] for c in ("context", "question") if c in columns] + [""])
        ids = list(t(prompt + columns["answer"])["input_ids"])
        if ids[-1] != t.eos_token_id:
            ids.append(t.eos_token_id)
        if self.learned_by == "all":
            return ids, [1] * len(ids)
        prompt_length = len(t(prompt, add_special_tokens=False)["input_ids"]) + \
            (1 if getattr(t, "add_bos_token", False) and t.bos_token_id is not None else 0)
        return ids, [0] * prompt_length + [1] * (len(ids) - prompt_length)


def _rows(paths):
    """(row or BadRow, "FILE:LINE") for every line of every file."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                where = f"{path}:{number}"
                if not line.strip():
                    yield BadRow("an empty line"), where
                    continue
                try:
                    yield json.loads(line), where
                except json.JSONDecodeError as e:
                    yield BadRow(f"not JSON ({e})"), where


def _read_template(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        config = json.loads(text)
    except json.JSONDecodeError:
        return text
    if isinstance(config, dict) and isinstance(config.get("chat_template"), str):
        return config["chat_template"]
    raise ValueError(f"--chat_template={path}: JSON without a string 'chat_template'")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a Hugging Face directory with the tokenizer's files")
    parser.add_argument("--output_prefix", required=True,
                        help="writes PREFIX.bin, .idx, .tokenizer.json and PREFIX_loss_mask.bin, .idx")
    parser.add_argument("--chat_template", help="a file with the chat template to use instead of the model's")
    parser.add_argument("--column_mapping", help="rows are prompt/completion columns: DEST=COLUMN,... with "
                                                 "DEST context, question, answer")
    parser.add_argument("--train_on_all", action="store_true", help="learn every token")
    parser.add_argument("--skip_invalid", action="store_true", help="skip and count bad rows")
    parser.add_argument("files", nargs="+", metavar="FILE")
    args = parser.parse_args(argv)
    try:
        import hf_tokenizer
        import megatron_indexed

        tokenizer = hf_tokenizer.load(args.model)
        mapping = parse_column_mapping(args.column_mapping) if args.column_mapping else None
        template = _read_template(args.chat_template) if args.chat_template else tokenizer.chat_template
    except (ImportError, hf_tokenizer.UsageError, ValueError, OSError) as e:
        print(f"hf_sft_tokenize: {e}", file=sys.stderr)
        return 2
    if isinstance(template, dict):  # a tokenizer with named templates: AutoModel takes "default"
        template = template.get("default", next(iter(template.values())))
    template_name = f"--chat_template={args.chat_template}" if args.chat_template else \
        f"the chat template of {args.model}"
    if template is None and mapping is None:
        print(f"hf_sft_tokenize: the tokenizer of {args.model} has no chat template: pass --chat_template=FILE, "
              "or --column_mapping for prompt/completion rows", file=sys.stderr)
        return 2
    if template is None and tokenizer.eos_token_id is None:
        print(f"hf_sft_tokenize: prompt/completion rows without a chat template end with EOS, and the "
              f"tokenizer of {args.model} has none", file=sys.stderr)
        return 2
    render = Renderer(tokenizer, template, template_name, mapping, args.train_on_all)

    dtype = megatron_indexed.token_dtype(len(tokenizer))
    tokens = megatron_indexed.Writer(args.output_prefix, dtype)
    masks = megatron_indexed.Writer(args.output_prefix + "_loss_mask", "uint8")
    learned = skipped = 0
    try:
        for row, where in _rows(args.files):
            try:
                if isinstance(row, BadRow):
                    raise row
                ids, mask = render(row, where)
            except BadRow as e:
                if not args.skip_invalid:
                    raise BadRow(f"{where}: {e} (--skip_invalid skips such rows)")
                print(f"hf_sft_tokenize: skipped {where}: {e}", file=sys.stderr)
                skipped += 1
                continue
            tokens.add_document([ids])
            masks.add_document([mask])
            learned += sum(mask)
        counts = tokens.finish(hf_tokenizer.record(args.model, tokenizer, append_eod=False))
        masks.finish(None)
    except (BadRow, TemplateRefused, OSError, ValueError, UnicodeDecodeError) as e:
        tokens.abandon()
        masks.abandon()
        print(f"hf_sft_tokenize: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output_prefix}.bin and .idx, {args.output_prefix}_loss_mask.bin and .idx: "
          f"{counts['documents']} conversations, {counts['tokens']} tokens ({counts['dtype']}, vocabulary "
          f"{len(tokenizer)}), {learned} learned tokens (by {render.describe()}), {skipped} invalid rows skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
