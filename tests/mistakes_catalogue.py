"""The common mistakes of every autograded question, planted in the reference answers.

Each entry of ``CAUGHT`` names an answer cell, edits that turn the reference answer into the
mistake (``(old, new)`` text replacements, each of which must apply), and the words of the
message the self-check prints for it: ``kind`` "fail" for a failing visible test, "warn" for a
warning of a visible test (a mistake a hidden test grades; the hand-in cell then says the
notebook is not ready).  ``HIDDEN_ONLY`` lists mistakes no visible check flags, with the
reason; ``tests/test_mistakes.py`` checks that the self-check indeed says nothing about them and
that a hidden test of the question fails.  ``docs/MISTAKES.md`` describes the same list.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mistake:
    assignment: str
    question: str
    name: str
    cell: str                                  # grade id of the answer cell the mistake is planted in
    edits: tuple                               # ((old, new), ...) applied to the reference answer
    expect: str = ""                           # words of the message that names the mistake
    kind: str = "fail"                         # "fail", "warn", or "hidden" (see HIDDEN_ONLY)
    why_hidden: str = ""                       # for kind "hidden": why no visible check can flag it

    @property
    def id(self) -> str:
        return f"{self.assignment}-{self.question}-{self.name}"


def M(assignment, question, name, cell, edits, expect, kind="fail", **kw):
    return Mistake(assignment, question, name, cell, tuple(edits), expect, kind, **kw)


def H(assignment, question, name, cell, edits, why, **kw):
    return Mistake(assignment, question, name, cell, tuple(edits), "", "hidden", why, **kw)


# ---------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------
_SPLIT = "return t.view(B, T, n_head, hs).transpose(1, 2)"
_QKV = "return split_heads(x @ w_q), split_heads(x @ w_k), split_heads(x @ w_v)"
_SCORES = "scores = q @ k.transpose(-2, -1) / math.sqrt(hs)"
_MHA_SCORES = "scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_size)"
_MHA_Q = "q = self.q_proj(query).view(B, T, self.n_head, self.head_size).transpose(1, 2)"
_PE_EXP = "torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)"

ATTENTION = [
    M("attention", "Q1", "heads_viewed_without_transpose", "get_multihead_qkv",
      [(_SPLIT, "return t.reshape(B, n_head, T, hs)")], "viewed straight as (B, nh, T, hs)"),
    M("attention", "Q1", "transpose_missing", "get_multihead_qkv",
      [(_SPLIT, "return t.view(B, T, n_head, hs)")], "transpose(1, 2) puts the heads before the tokens"),
    M("attention", "Q1", "heads_interleaved", "get_multihead_qkv",
      [(_SPLIT, "return t.view(B, T, hs, n_head).permute(0, 3, 1, 2)")], "channels of the heads are interleaved"),
    M("attention", "Q1", "weights_transposed", "get_multihead_qkv",
      [(_QKV, "return split_heads(x @ w_q.T), split_heads(x @ w_k.T), split_heads(x @ w_v.T)")],
      "applied as x @ w.T"),
    M("attention", "Q1", "w_q_used_for_k_and_v", "get_multihead_qkv",
      [(_QKV, "return split_heads(x @ w_q), split_heads(x @ w_q), split_heads(x @ w_q)")],
      "w_q used twice", "warn"),
    M("attention", "Q1", "global_n_head", "get_multihead_qkv",
      [("hs = C // n_head", "hs = C // N_HEAD"), (_SPLIT, "return t.view(B, T, N_HEAD, hs).transpose(1, 2)")],
      "uses the notebook's N_HEAD"),

    M("attention", "Q2", "no_scaling", "calculate_multihead_attention",
      [(_SCORES, "scores = q @ k.transpose(-2, -1)")], "the scores are not divided by sqrt(hs)", "warn"),
    M("attention", "Q2", "scaled_by_hs", "calculate_multihead_attention",
      [(_SCORES, "scores = q @ k.transpose(-2, -1) / hs")], "divided by hs, not by sqrt(hs)", "warn"),
    M("attention", "Q2", "mask_after_softmax", "calculate_multihead_attention",
      [('scores = scores.masked_fill(~mask, float("-inf"))', "pass"),
       ("weights = torch.softmax(scores, dim=-1)  # (B, nh, T, S)",
        "weights = torch.softmax(scores, dim=-1)  # (B, nh, T, S)\n"
        "    if mask is not None:\n        weights = weights.masked_fill(~mask, 0.0)")],
      "the mask is applied after the softmax"),
    M("attention", "Q2", "softmax_over_queries", "calculate_multihead_attention",
      [("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)")], "the columns of the weights sum to 1"),
    M("attention", "Q2", "mask_inverted", "calculate_multihead_attention",
      [("scores.masked_fill(~mask,", "scores.masked_fill(mask,")], "the mask is inverted"),
    M("attention", "Q2", "masked_scores_set_to_zero", "calculate_multihead_attention",
      [('scores.masked_fill(~mask, float("-inf"))', "scores.masked_fill(~mask, 0.0)")],
      "set those scores to -inf before the softmax"),
    M("attention", "Q2", "mask_ignored", "calculate_multihead_attention",
      [('scores = scores.masked_fill(~mask, float("-inf"))', "pass")], "the mask is not applied"),
    M("attention", "Q2", "output_and_weights_swapped", "calculate_multihead_attention",
      [("return weights @ v, weights", "return weights, weights @ v")], "not (weights, output)"),

    M("attention", "Q3", "no_scaling", "multi_head_attention",
      [(_MHA_SCORES, "scores = q @ k.transpose(-2, -1)")], "the scores are not divided by sqrt(head_size)"),
    M("attention", "Q3", "value_projected_from_key", "multi_head_attention",
      [("self.v_proj(value)", "self.v_proj(key)")], "values are projected from the key", "warn"),
    M("attention", "Q3", "heads_merged_without_transpose", "multi_head_attention",
      [("y = y.transpose(1, 2).contiguous().view(B, T, C)", "y = y.contiguous().view(B, T, C)")],
      "put back together without transpose(1, 2)"),
    M("attention", "Q3", "query_split_without_transpose", "multi_head_attention",
      [(_MHA_Q, "q = self.q_proj(query).view(B, self.n_head, T, self.head_size)")],
      "q split into heads without transpose(1, 2)"),
    M("attention", "Q3", "mask_ignored", "multi_head_attention",
      [('scores = scores.masked_fill(~mask, float("-inf"))', "pass")], "the mask is ignored", "warn"),
    M("attention", "Q3", "out_proj_missing", "multi_head_attention",
      [("return self.out_proj(y), weights", "return y, weights")], "out_proj is not applied"),
    M("attention", "Q3", "calls_the_q2_function", "multi_head_attention",
      [("y = weights @ v  # (B, nh, T, hs)", "y, weights = calculate_multihead_attention(q, k, v, mask)")],
      "it uses: calculate_multihead_attention"),
    M("attention", "Q3", "key_length_taken_from_query", "multi_head_attention",
      [("S = key.size(1)", "S = T")], "split key and value with their own length", "warn"),

    M("attention", "Q4", "sin_cos_swapped", "positional_encoding",
      [("torch.sin(position * inv_freq)", "torch.SIN"), ("torch.cos(position * inv_freq)", "torch.sin(position * inv_freq)"),
       ("torch.SIN", "torch.cos(position * inv_freq)")], "sin and cos are swapped"),
    M("attention", "Q4", "exponent_i_over_C", "positional_encoding",
      [(_PE_EXP, "torch.arange(0, d_model // 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)")],
      "the exponent is i/C", "warn"),
    M("attention", "Q4", "exponent_doubled", "positional_encoding",
      [("(-math.log(10000.0) / d_model)", "(-2 * math.log(10000.0) / d_model)")], "which doubles it", "warn"),
    M("attention", "Q4", "positions_multiplied", "positional_encoding",
      [("(-math.log(10000.0) / d_model)", "(math.log(10000.0) / d_model)")],
      "positions are multiplied by 10000^(2i/C)", "warn"),
    M("attention", "Q4", "forward_returns_p_only", "positional_encoding",
      [("return x + self.pe[:T]", "return self.pe[:T].expand_as(x)")], "forward must return x + p[:T]", "warn"),
    M("attention", "Q4", "table_is_a_parameter", "positional_encoding",
      [('self.register_buffer("pe", table)', "self.pe = nn.Parameter(table)")],
      "must not be a trainable nn.Parameter", "warn"),
    M("attention", "Q4", "table_is_a_plain_attribute", "positional_encoding",
      [('self.register_buffer("pe", table)', "self.pe = table")], "a plain attribute is not in the state_dict", "warn"),
    M("attention", "Q4", "max_len_off_by_one", "positional_encoding",
      [("if T > self.max_len:", "if T >= self.max_len:")], "T == max_len must work"),
    M("attention", "Q4", "no_value_error", "positional_encoding",
      [('raise ValueError(f"sequence length {T} exceeds max_len {self.max_len}")', "pass")],
      "must raise ValueError, not RuntimeError"),
]


# ---------------------------------------------------------------------------------------
# finetune
# ---------------------------------------------------------------------------------------
_TOK = 'return tokenizer(batch["text"], truncation=True, max_length=max_length)'
_TRAIN_DL = ("train_loader = DataLoader(train_ds, batch_size=batch_size, shuffle=True, collate_fn=collate,\n"
             "                              generator=torch.Generator().manual_seed(0))")
_COUNT = "return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)"

FINETUNE = [
    M("finetune", "Q1", "padded_to_max_length", "preprocess",
      [(_TOK, 'return tokenizer(batch["text"], truncation=True, max_length=max_length, padding="max_length")')],
      "do not pad in preprocess"),
    M("finetune", "Q1", "not_truncated", "preprocess",
      [(_TOK, 'return tokenizer(batch["text"])')], "truncate to the max_length argument"),
    M("finetune", "Q1", "global_max_length", "preprocess",
      [(_TOK, 'return tokenizer(batch["text"], truncation=True, max_length=SETTINGS["max_length"])')],
      "use the argument, not SETTINGS['max_length']"),
    M("finetune", "Q1", "text_column_kept", "preprocess",
      [('encoded.set_format("torch", columns=["input_ids", "attention_mask", "label"])', 'encoded.set_format("torch")')],
      "drops text"),
    M("finetune", "Q1", "tensors_from_the_tokenizer", "preprocess",
      [(_TOK, 'return tokenizer(batch["text"], truncation=True, max_length=max_length, return_tensors="pt")')],
      "call the tokenizer without return_tensors='pt'"),
    M("finetune", "Q1", "special_tokens_dropped", "preprocess",
      [(_TOK, 'return tokenizer(batch["text"], truncation=True, max_length=max_length, add_special_tokens=False)')],
      "rows start with [CLS]"),
    M("finetune", "Q1", "label_renamed", "preprocess",
      [("encoded.set_format(", 'encoded = encoded.rename_column("label", "labels")\n    encoded.set_format('),
       ('columns=["input_ids", "attention_mask", "label"]', 'columns=["input_ids", "attention_mask", "labels"]')],
      "keep the name label"),

    M("finetune", "Q2", "no_collate_fn", "make_dataloaders",
      [(", collate_fn=collate", "")], "pass collate_fn=DataCollatorWithPadding(tokenizer)"),
    M("finetune", "Q2", "batches_padded_to_max_length", "make_dataloaders",
      [('DataCollatorWithPadding(tokenizer, return_tensors="pt")',
        'DataCollatorWithPadding(tokenizer, padding="max_length", max_length=SETTINGS["max_length"], return_tensors="pt")')],
      "pad each batch to its longest row"),
    M("finetune", "Q2", "test_rows_shuffled", "make_dataloaders",
      [("test_loader = DataLoader(test_ds, batch_size=batch_size, shuffle=False",
        "test_loader = DataLoader(test_ds, batch_size=batch_size, shuffle=True")],
      "keep the test rows in order"),
    M("finetune", "Q2", "shuffle_not_seeded", "make_dataloaders",
      [(_TRAIN_DL, "train_loader = DataLoader(train_ds, batch_size=batch_size, shuffle=True, collate_fn=collate)")],
      "two calls give the training rows in different orders", "warn"),
    M("finetune", "Q2", "training_rows_not_shuffled", "make_dataloaders",
      [(_TRAIN_DL, "train_loader = DataLoader(train_ds, batch_size=batch_size, shuffle=False, collate_fn=collate)")],
      "the training rows come in their stored order", "warn"),
    M("finetune", "Q2", "drop_last", "make_dataloaders",
      [("generator=torch.Generator().manual_seed(0))", "generator=torch.Generator().manual_seed(0), drop_last=True)")],
      "no drop_last"),
    M("finetune", "Q2", "build_model_ignores_num_labels", "build_model",
      [("load_classifier(num_labels=num_labels, arch=arch)", "load_classifier(arch=arch)")],
      "pass both arguments on", "warn"),
    M("finetune", "Q2", "build_model_ignores_arch", "build_model",
      [("load_classifier(num_labels=num_labels, arch=arch)", "load_classifier(num_labels=num_labels)")],
      "pass both arguments on", "warn"),
    M("finetune", "Q2", "model_not_moved", "build_model",
      [("return model.to(device)", "return model")], "build_model never moves the model", "warn"),
    M("finetune", "Q2", "evaluate_without_eval_mode", "evaluate",
      [("    model.eval()\n", "")], "call model.eval() in evaluate", "warn"),
    M("finetune", "Q2", "evaluate_mean_of_batch_accuracies", "evaluate",
      [("correct += int((logits.argmax(-1) == labels).sum())\n            total += labels.numel()",
        "correct += float((logits.argmax(-1) == labels).float().mean())\n            total += 1")],
      "the mean of the per-batch accuracies", "warn"),
    M("finetune", "Q2", "evaluate_returns_a_tensor", "evaluate",
      [("return correct / total", "return torch.tensor(correct / total)")], "return a Python float"),
    M("finetune", "Q2", "evaluate_reads_label", "evaluate",
      [('labels = batch["labels"]', 'labels = batch["label"]')], "the batches hold input_ids, attention_mask and labels"),
    M("finetune", "Q2", "evaluate_argmax_over_the_batch", "evaluate",
      [("logits.argmax(-1) == labels", "logits.argmax(0) == labels")], "take the arg-max over the classes"),
    M("finetune", "Q2", "gradients_never_cleared", "train_one_epoch",
      [("        optimizer.zero_grad(set_to_none=True)\n", "")], "the gradients are never cleared", "warn"),
    M("finetune", "Q2", "zero_grad_between_backward_and_step", "train_one_epoch",
      [("loss.backward()\n        optimizer.step()", "loss.backward()\n        optimizer.zero_grad()\n        optimizer.step()")],
      "never zero_grad between backward and step"),
    M("finetune", "Q2", "no_training_mode", "train_one_epoch",
      [("    model.train()\n", "")], "call model.train() first", "warn"),
    M("finetune", "Q2", "returns_the_last_loss", "train_one_epoch",
      [("return sum(losses) / len(losses)", "return losses[-1]")], "that is the loss of the last batch", "warn"),
    M("finetune", "Q2", "returns_the_sum_of_losses", "train_one_epoch",
      [("return sum(losses) / len(losses)", "return sum(losses)")], "not their sum"),
    M("finetune", "Q2", "scheduler_not_stepped", "train_one_epoch",
      [("        if scheduler is not None:\n            scheduler.step()\n", "")],
      "call scheduler.step() once per batch", "warn"),
    M("finetune", "Q2", "returns_a_tensor", "train_one_epoch",
      [("losses.append(loss.item())", "losses.append(loss.detach())")], "return a Python float"),

    M("finetune", "Q3", "predict_without_eval_mode", "predict",
      [("    model.eval()\n", "")], "call model.eval() in predict"),
    M("finetune", "Q3", "predict_without_attention_mask", "predict",
      [('logits = model(input_ids=enc["input_ids"].to(device),\n'
        '                           attention_mask=enc["attention_mask"].to(device)).logits',
        'logits = model(input_ids=enc["input_ids"].to(device)).logits')],
      "pass attention_mask to the model", "warn"),
    M("finetune", "Q3", "predict_first_batch_only", "predict",
      [("for start in range(0, len(texts), batch_size):", "for start in range(0, min(len(texts), 1), batch_size):")],
      "loop over all texts in steps of batch_size", "warn"),
    M("finetune", "Q3", "predict_returns_tensors", "predict",
      [("out += [int(i) for i in logits.argmax(-1).tolist()]", "out += list(logits.argmax(-1))")],
      "entries must be Python ints"),
    M("finetune", "Q3", "predict_returns_a_tensor", "predict",
      [("    return out\n", "    return torch.tensor(out)\n")], "return a list with one entry per text"),

    M("finetune", "Q4", "counts_tensors", "count_parameters",
      [(_COUNT, "return sum(1 for p in model.parameters() if p.requires_grad or not trainable_only)")],
      "that is the number of parameter tensors"),
    M("finetune", "Q4", "weights_only", "count_parameters",
      [(_COUNT, "return sum(p.numel() for p in model.parameters() if p.dim() > 1)")], "the biases are missing"),
    M("finetune", "Q4", "shared_counted_twice", "count_parameters",
      [(_COUNT, "return sum(p.numel() for n, p in model.named_parameters(remove_duplicate=False)\n"
                "               if p.requires_grad or not trainable_only)")],
      "a layer used twice counts once", "warn"),
    M("finetune", "Q4", "trainable_only_ignored", "count_parameters",
      [(_COUNT, "return sum(p.numel() for p in model.parameters())")], "count only parameters with p.requires_grad", "warn"),
    M("finetune", "Q4", "returns_a_float", "count_parameters",
      [(_COUNT, "return float(sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only))")],
      "return a Python int"),
]

# ---------------------------------------------------------------------------------------
# project_aether
# ---------------------------------------------------------------------------------------
_LSE = "log_normaliser = top + math.log(sum(math.exp(v - top) for v in z))"

AETHER = [
    M("project_aether", "Q2", "logit_over_sum_of_logits", "mlm_probability_and_loss",
      [("return math.exp(-loss), loss", "p = z[target_index] / sum(z)\n    return p, -math.log(abs(p))")],
      "not z_t / sum(z)"),
    M("project_aether", "Q2", "largest_logit_not_target", "mlm_probability_and_loss",
      [("loss = log_normaliser - z[target_index]", "loss = log_normaliser - max(z)")],
      "use the logit of target_index", "warn"),
    M("project_aether", "Q2", "exp_overflows", "mlm_probability_and_loss",
      [(_LSE, "log_normaliser = math.log(sum(math.exp(v) for v in z))")], "exp(1000) overflows", "warn"),
    M("project_aether", "Q2", "loss_in_bits", "mlm_probability_and_loss",
      [("return math.exp(-loss), loss", "return math.exp(-loss), loss / math.log(2)")], "log base 2"),
    M("project_aether", "Q2", "loss_sign", "mlm_probability_and_loss",
      [("return math.exp(-loss), loss", "return math.exp(-loss), -loss")], "the loss has the wrong sign"),
    M("project_aether", "Q2", "float32_tensors", "mlm_probability_and_loss",
      [("return math.exp(-loss), loss",
        "t = torch.tensor(z)\n    loss = float(torch.logsumexp(t, 0) - t[target_index])\n    return math.exp(-loss), loss")],
      "float32 rounding"),
    M("project_aether", "Q2", "returns_tensors", "mlm_probability_and_loss",
      [("return math.exp(-loss), loss", "return torch.tensor(math.exp(-loss)), torch.tensor(loss)")],
      "return two Python floats"),

    M("project_aether", "Q4", "heads_missing", "attention_scores_bytes",
      [("return n_heads * seq_len * seq_len * bytes_per_value", "return seq_len * seq_len * bytes_per_value")],
      "the heads are missing"),
    M("project_aether", "Q4", "bits_not_bytes", "attention_scores_bytes",
      [("return n_heads * seq_len * seq_len * bytes_per_value", "return 8 * n_heads * seq_len * seq_len * bytes_per_value")],
      "that is bits"),
    M("project_aether", "Q4", "linear_in_length", "attention_scores_bytes",
      [("return n_heads * seq_len * seq_len * bytes_per_value", "return n_heads * seq_len * bytes_per_value")],
      "seq_len x seq_len entries"),
    M("project_aether", "Q4", "float_division", "attention_scores_bytes",
      [("return n_heads * seq_len * seq_len * bytes_per_value", "return n_heads * seq_len ** 2 * bytes_per_value / 1")],
      "return an exact int"),
    M("project_aether", "Q4", "torch_inside", "attention_scores_bytes",
      [("return n_heads * seq_len * seq_len * bytes_per_value",
        "return int(torch.empty(n_heads, seq_len, seq_len, device='meta').numel()) * bytes_per_value")],
      "compute the bytes with integer arithmetic", "warn"),
    M("project_aether", "Q4", "gb_written_in_mb", "attention_scores_gb",
      [("attention_scores_bytes(MAX_CONTEXT, N_HEADS, 2) / 1e9", "attention_scores_bytes(MAX_CONTEXT, N_HEADS, 2) / 1e6")],
      "that is MB", "warn"),
    M("project_aether", "Q4", "gb_for_all_layers", "attention_scores_gb",
      [("attention_scores_bytes(MAX_CONTEXT, N_HEADS, 2) / 1e9",
        "N_LAYERS * attention_scores_bytes(MAX_CONTEXT, N_HEADS, 2) / 1e9")],
      "that is all 48 layers", "warn"),

    M("project_aether", "Q5", "biases_missing", "ffn_params",
      [("up = hidden * inner + inner", "up = hidden * inner"), ("down = inner * hidden + hidden", "down = inner * hidden")],
      "the biases are missing"),
    M("project_aether", "Q5", "first_bias_of_width_H", "ffn_params",
      [("up = hidden * inner + inner", "up = hidden * inner + hidden")], "the first layer's bias has 4H entries"),
    M("project_aether", "Q5", "second_linear_missing", "ffn_params",
      [("return n_layers * (up + down)", "return n_layers * up")], "only the first linear layer (H -> 4H) is counted"),
    M("project_aether", "Q5", "one_layer_only", "ffn_params",
      [("return n_layers * (up + down)", "return up + down")], "that is one layer"),
    M("project_aether", "Q5", "torch_inside", "ffn_params",
      [("return n_layers * (up + down)",
        "return n_layers * sum(p.numel() for p in nn.Linear(hidden, inner, device='meta').parameters()) + n_layers * down")],
      "compute the count by formula", "warn"),

    M("project_aether", "Q6", "B_shaped_like_A", "lora_params",
      [("per_matrix = rank * d_in + d_out * rank", "per_matrix = 2 * rank * d_in")], "not 2*r*d_in"),
    M("project_aether", "Q6", "full_rank_update", "lora_params",
      [("per_matrix = rank * d_in + d_out * rank", "per_matrix = d_in * d_out * rank")], "A and B are low-rank"),
    M("project_aether", "Q6", "frozen_matrix_counted", "lora_params",
      [("per_matrix = rank * d_in + d_out * rank", "per_matrix = rank * d_in + d_out * rank + d_in * d_out")],
      "the frozen d_in x d_out matrix does not count"),
    M("project_aether", "Q6", "layers_not_multiplied", "lora_params",
      [("return n_layers * n_matrices_per_layer * per_matrix", "return n_matrices_per_layer * per_matrix")],
      "multiply by n_matrices_per_layer and by n_layers"),
    M("project_aether", "Q6", "biases_added", "lora_params",
      [("per_matrix = rank * d_in + d_out * rank", "per_matrix = rank * d_in + d_out * rank + rank + d_out")],
      "LoRA here adds no biases"),
    M("project_aether", "Q6", "peft_inside", "lora_params",
      [("    per_matrix = rank * d_in + d_out * rank\n",
        "    import peft\n    per_matrix = rank * d_in + d_out * rank\n")],
      "compute the count by formula", "warn"),

    M("project_aether", "Q7", "one_state_per_parameter", "adam_state_bytes",
      [("return n_params * states * bytes_per_state", "return n_params * bytes_per_state")],
      "Adam keeps two values per parameter"),
    M("project_aether", "Q7", "parameters_counted_as_state", "adam_state_bytes",
      [("return n_params * states * bytes_per_state", "return n_params * (states + 1) * bytes_per_state")],
      "the parameters themselves are not optimizer state"),
    M("project_aether", "Q7", "bits_not_bytes", "adam_state_bytes",
      [("return n_params * states * bytes_per_state", "return 8 * n_params * states * bytes_per_state")], "that is bits"),
    M("project_aether", "Q7", "arguments_ignored", "adam_state_bytes",
      [("return n_params * states * bytes_per_state", "return n_params * 2 * 4")], "use the arguments bytes_per_state and states"),
    M("project_aether", "Q7", "step_counter_counted", "adam_state_bytes",
      [("return n_params * states * bytes_per_state", "return n_params * states * bytes_per_state + 8")],
      "ignore the step counter"),

    M("project_aether", "Q8", "fraction_not_percent", "memory_ratio",
      [("return 100.0 * lora / ffn, ffn / lora", "return lora / ffn, ffn / lora")], "percent * factor is 1"),
    M("project_aether", "Q8", "ratio_inverted", "memory_ratio",
      [("return 100.0 * lora / ffn, ffn / lora", "return 100.0 * ffn / lora, ffn / lora")],
      "that is FFN state / LoRA state"),
    M("project_aether", "Q8", "notebook_globals", "memory_ratio",
      [("lora_params(hidden, hidden, rank, n_adapted_per_layer, n_layers)",
        "lora_params(HIDDEN, HIDDEN, LORA_RANK, ADAPTED_PER_LAYER, N_LAYERS)"),
       ("ffn_params(hidden, n_layers)", "ffn_params(HIDDEN, N_LAYERS)")],
      "memory_ratio uses the notebook's"),
    M("project_aether", "Q8", "ffn_without_biases_inline", "memory_ratio",
      [("ffn = adam_state_bytes(ffn_params(hidden, n_layers))", "ffn = adam_state_bytes(8 * hidden * hidden * n_layers)")],
      "compute both states with your adam_state_bytes"),
    M("project_aether", "Q8", "integer_division", "memory_ratio",
      [("return 100.0 * lora / ffn, ffn / lora", "return 100 * lora // ffn, ffn // lora")], "return two floats"),
]

# ---------------------------------------------------------------------------------------
# parameters_and_lora
# ---------------------------------------------------------------------------------------
_ACC = ("n_right += int((logits.argmax(dim=-1) == on_device[\"labels\"]).sum())\n"
        "            n_seen += on_device[\"labels\"].numel()")
_LORA = 'LoraConfig(r=16, lora_alpha=32, target_modules=adapted, bias="none", task_type=TaskType.SEQ_CLS)'

PLORA = [
    M("parameters_and_lora", "Q1", "attention_biases_missing", "encoder_params",
      [("attention = 4 * (d * d + d)", "attention = 4 * d * d")], "4*d too few per layer"),
    M("parameters_and_lora", "Q1", "ffn_biases_missing", "encoder_params",
      [("feed_forward = d * d_ff + d_ff + d_ff * d + d", "feed_forward = d * d_ff + d_ff * d")],
      "the biases of the two feed-forward layers"),
    M("parameters_and_lora", "Q1", "projections_per_head", "encoder_params",
      [("attention = 4 * (d * d + d)", "attention = n_heads * 4 * (d * d + d)")], "does not depend on n_heads"),
    M("parameters_and_lora", "Q1", "position_table_missing", "encoder_params",
      [("tables = vocab_size * d + max_len * d", "tables = vocab_size * d")], "the table of position embeddings"),
    M("parameters_and_lora", "Q1", "ffn_width_4d", "encoder_params",
      [("feed_forward = d * d_ff + d_ff + d_ff * d + d", "feed_forward = 8 * d * d + 5 * d")],
      "use the d_ff argument, not 4*d", "warn"),
    M("parameters_and_lora", "Q1", "norm_options_ignored", "encoder_params",
      [("extra_norms = 2 * d * (int(bool(embedding_norm)) + int(bool(final_norm)))", "extra_norms = 2 * d")],
      "one LayerNorm (2*d) too few", "warn"),
    M("parameters_and_lora", "Q1", "model_built_inside", "encoder_params",
      [("    d = d_model\n",
        "    d = d_model\n    return sum(p.numel() for p in Encoder(n_layers, d_model, n_heads, d_ff, vocab_size, max_len,\n"
        "                                          embedding_norm, final_norm).parameters())\n")],
      "compute the count by formula"),

    M("parameters_and_lora", "Q2", "seed_ffn_width_2048", "seed_assumptions",
      [("d_ff=512", "d_ff=2048")], "its feed-forward width d_ff equals d_model", "warn"),
    M("parameters_and_lora", "Q2", "seed_max_len_T", "seed_assumptions",
      [("max_len=T + 2", "max_len=T")], "T + 2 = 258 position rows", "warn"),
    M("parameters_and_lora", "Q2", "seed_final_norm", "seed_assumptions",
      [("final_norm=False", "final_norm=True")], "no LayerNorm after the last layer", "warn"),
    M("parameters_and_lora", "Q2", "seed_norm_as_int", "seed_assumptions",
      [("embedding_norm=True", "embedding_norm=1")], "embedding_norm and final_norm are bools"),
    M("parameters_and_lora", "Q2", "formula_T_without_2", "formula_4_as_printed",
      [("n_tokens * (d + (T + 2))", "n_tokens * (d + T)")], "has T + 2, and the formula ends with + 2d: one of them is missing"),
    M("parameters_and_lora", "Q2", "formula_without_2d", "formula_4_as_printed",
      [("n_tokens * (d + (T + 2)) + 2 * d", "n_tokens * (d + (T + 2))")], "has T + 2, and the formula ends with + 2d: one of them is missing"),
    M("parameters_and_lora", "Q2", "formula_biases_corrected", "formula_4_as_printed",
      [("3 * (d**2 + d**2), d**2 + d, 2 * (d**2 + d**2)", "3 * (d**2 + d), d**2 + d, 2 * (d**2 + d)")],
      "the bias terms are written d^2 + d^2 in formula (4)", "warn"),
    M("parameters_and_lora", "Q2", "formula_norm_corrected", "formula_4_as_printed",
      [("3 * (d**2 + d**2), d**2 + d, 2 * (d**2 + d**2), 4 * d**2", "3 * (d**2 + d**2), d**2 + d, 2 * (d**2 + d**2), 4 * d")],
      "the norm term is printed as 4d^2", "warn"),
    M("parameters_and_lora", "Q2", "formula_is_the_true_count", "formula_4_as_printed",
      [("return n_layers * (attention + concat + feedforward + norm) + n_tokens * (d + (T + 2)) + 2 * d",
        "return n_layers * (3 * (d**2 + d) + d**2 + d + 2 * (d**2 + d) + 4 * d) + n_tokens * d + (T + 2) * d + 2 * d")],
      "that is the corrected count", "warn"),
    M("parameters_and_lora", "Q2", "formula_bracket_not_multiplied", "formula_4_as_printed",
      [("return n_layers * (attention + concat + feedforward + norm)", "return (attention + concat + feedforward + norm)")],
      "the bracket is multiplied by N", "warn"),

    M("parameters_and_lora", "Q3", "evaluate_without_eval_mode", "evaluate_accuracy",
      [("    model.eval()  # dropout off for evaluation\n", "")], "call model.eval() before evaluating"),
    M("parameters_and_lora", "Q3", "evaluate_mean_of_batch_accuracies", "evaluate_accuracy",
      [(_ACC, "n_right += float((logits.argmax(dim=-1) == on_device[\"labels\"]).float().mean())\n"
              "            n_seen += 1")],
      "the mean of the per-batch accuracies", "warn"),
    M("parameters_and_lora", "Q3", "evaluate_divides_by_full_batches", "evaluate_accuracy",
      [("return n_right / n_seen", "return n_right / (len(loader) * 4)")], "the last batch is smaller", "warn"),
    M("parameters_and_lora", "Q3", "evaluate_argmax_over_the_batch", "evaluate_accuracy",
      [("logits.argmax(dim=-1)", "logits.argmax(dim=0)")], "take the arg-max over the classes"),
    M("parameters_and_lora", "Q3", "evaluate_returns_a_tensor", "evaluate_accuracy",
      [("return n_right / n_seen", "return torch.tensor(n_right / n_seen)")], "return a Python float"),
    M("parameters_and_lora", "Q3", "optimizer_created_in_the_loop", "train_epochs",
      [("    adamw = torch.optim.AdamW(model.parameters(), lr=lr)\n", ""),
       ("        model.train()  # dropout on while training\n",
        "        model.train()  # dropout on while training\n        adamw = torch.optim.AdamW(model.parameters(), lr=lr)\n")],
      "AdamW is created inside a loop", "warn"),
    M("parameters_and_lora", "Q3", "no_training_mode", "train_epochs",
      [("        model.train()  # dropout on while training\n", "")],
      "call model.train() at the start of every epoch", "warn"),
    M("parameters_and_lora", "Q3", "returns_losses", "train_epochs",
      [("history.append(evaluate_accuracy(model, test_loader))",
        "history.append(evaluate_accuracy(model, test_loader)) or None\n        history[-1] = min(1.0, loss_sum / n_steps)")],
      "return what evaluate_accuracy(model, test_loader) gave", "warn"),
    M("parameters_and_lora", "Q3", "gradients_never_cleared", "train_epochs",
      [("            adamw.zero_grad()\n", "")], "the gradients are never cleared", "warn"),
    M("parameters_and_lora", "Q3", "lr_not_passed", "train_epochs",
      [("torch.optim.AdamW(model.parameters(), lr=lr)", "torch.optim.AdamW(model.parameters())")],
      "pass lr to torch.optim.AdamW", "warn"),
    M("parameters_and_lora", "Q3", "zero_grad_between_backward_and_step", "train_epochs",
      [("adamw.zero_grad()\n            step_loss.backward()\n            adamw.step()",
        "step_loss.backward()\n            adamw.zero_grad()\n            adamw.step()")],
      "training must change the weights"),
    M("parameters_and_lora", "Q3", "scratch_is_a_copy", "build_models",
      [("scratch = pretrained.__class__(pretrained.config)", "scratch = copy.deepcopy(pretrained)")],
      "scratch must be a new model with random weights"),
    M("parameters_and_lora", "Q3", "pretrained_with_two_labels", "build_models",
      [("load_classifier(num_labels=4)", "load_classifier(num_labels=2)")], "pretrained has 2 labels", "warn"),

    M("parameters_and_lora", "Q4", "out_lin_adapted", "make_lora_config",
      [('adapted = ["q_lin", "k_lin", "v_lin"]', 'adapted = ["q_lin", "k_lin", "v_lin", "out_lin"]')],
      "out_lin, the output projection, stays without an adapter", "warn"),
    M("parameters_and_lora", "Q4", "key_projection_missing", "make_lora_config",
      [('adapted = ["q_lin", "k_lin", "v_lin"]', 'adapted = ["q_lin", "v_lin"]')],
      "adapt all three projections", "warn"),
    M("parameters_and_lora", "Q4", "rank_8", "make_lora_config",
      [(_LORA, _LORA.replace("r=16", "r=8"))], "r = 16 and lora_alpha = 32"),
    M("parameters_and_lora", "Q4", "biases_trained", "make_lora_config",
      [(_LORA, _LORA.replace('bias="none"', 'bias="all"'))], 'no bias training: bias="none"'),
    M("parameters_and_lora", "Q4", "task_type_missing", "make_lora_config",
      [(_LORA, _LORA.replace(", task_type=TaskType.SEQ_CLS", ""))], "task_type=TaskType.SEQ_CLS"),
    M("parameters_and_lora", "Q4", "only_A_counted", "lora_trainable_params",
      [("per_adapter = rank * d_model + d_model * rank", "per_adapter = rank * d_model")], "count both matrices"),
    M("parameters_and_lora", "Q4", "layers_not_multiplied", "lora_trainable_params",
      [("return n_layers * n_adapted_per_layer * per_adapter", "return n_adapted_per_layer * per_adapter")],
      "multiply by n_layers"),
    M("parameters_and_lora", "Q4", "frozen_matrices_counted", "lora_trainable_params",
      [("per_adapter = rank * d_model + d_model * rank", "per_adapter = d_model * d_model")],
      "that is the frozen d x d matrices"),
    M("parameters_and_lora", "Q4", "biases_counted", "lora_trainable_params",
      [("per_adapter = rank * d_model + d_model * rank", "per_adapter = rank * d_model + d_model * rank + d_model")],
      'no biases here (bias="none")'),
]


# ---------------------------------------------------------------------------------------
# concepts
# ---------------------------------------------------------------------------------------
_SCORES_BLOCK = ("weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_size), dim=-1)  # (B, nh, T, T)\n"
                 "                weights @ v  # (B, nh, T, hs)")

CONCEPTS = [
    M("concepts", "Q7", "weighted_sum_not_counted", "attention_growth",
      [(_SCORES_BLOCK, "weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_size), dim=-1)  # (B, nh, T, T)"),
       ("out[\"weight_elements\"].append(int(weights.numel()))",
        "out[\"weight_elements\"].append(int(weights.numel()))\n            weights @ v")],
      "count both products, q @ k^T and weights @ v", "warn"),
    M("concepts", "Q7", "weights_of_one_head", "attention_growth",
      [("out[\"weight_elements\"].append(int(weights.numel()))", "out[\"weight_elements\"].append(int(weights[0, 0].numel()))")],
      "count the weights of every head"),
    M("concepts", "Q7", "ffn_without_expansion", "attention_growth",
      [("ffn = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))",
        "ffn = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))")],
      "the feed-forward network is d -> 4d -> d", "warn"),
    M("concepts", "Q7", "slope_of_the_counts", "attention_growth",
      [("out[\"slopes\"] = {key: fit_loglog_slope(lengths, out[key]) for key in list(out)}",
        "out[\"slopes\"] = {key: float((out[key][-1] - out[key][0]) / (lengths[-1] - lengths[0])) for key in list(out)}")],
      "fit the slope of log(count) against log(T)"),
    M("concepts", "Q7", "float_counts", "attention_growth",
      [("out[\"score_flops\"].append(int(counter.get_total_flops()))",
        "out[\"score_flops\"].append(float(counter.get_total_flops()))")],
      "use Python ints"),
    M("concepts", "Q7", "numpy_slopes", "attention_growth",
      [("out[\"slopes\"] = {key: fit_loglog_slope(lengths, out[key]) for key in list(out)}",
        "import numpy as np\n    out[\"slopes\"] = {key: np.polyfit(np.log(lengths), np.log(out[key]), 1)[0] for key in list(out)}")],
      "slopes are Python floats"),

    M("concepts", "Q12", "masks_not_restored", "head_importance",
      [("                        mask[h] = saved\n", "                        pass\n")], "switch every head back on"),
    M("concepts", "Q12", "training_mode_not_restored", "head_importance",
      [("        model.train(training_before)\n", "        pass\n")],
      "put the model back in training mode"),
    M("concepts", "Q12", "sign_reversed", "head_importance",
      [("out[l, h] = model(x, y)[1].item() - base", "out[l, h] = base - model(x, y)[1].item()")],
      "the sign is reversed", "warn"),
    M("concepts", "Q12", "whole_layer_switched_off", "head_importance",
      [("mask[h] = 0.0", "mask[:] = 0.0"), ("mask[h] = saved", "mask[:] = 1.0")],
      "switch off one head at a time"),
    M("concepts", "Q12", "dropout_left_on", "head_importance",
      [("    model.train(False)  # evaluation mode: no dropout\n", "")], "with dropout the importances change", "warn"),
    M("concepts", "Q12", "always_back_to_training_mode", "head_importance",
      [("model.train(training_before)", "model.train()")], "the model was in evaluation mode", "warn"),
    M("concepts", "Q12", "float64_result", "head_importance",
      [("out = torch.zeros(len(blocks), model.config.n_head)",
        "out = torch.zeros(len(blocks), model.config.n_head, dtype=torch.float64)")],
      "return a float32 tensor on the CPU"),
]

# ---------------------------------------------------------------------------------------
# llm_lab
# ---------------------------------------------------------------------------------------
_TOPP_KEEP = "keep_sorted = mass_before < p"
_SAMPLE_FILTERS = ("    logits = apply_temperature(logits, temperature)\n"
                   "    if top_k is not None:\n        logits = top_k_filter(logits, top_k)\n"
                   "    if top_p is not None:\n        logits = top_p_filter(logits, top_p)\n")

LLM_LAB = [
    M("llm_lab", "Q1", "multiplied_by_t", "apply_temperature",
      [("return logits / t", "return logits * t")], "the logits are multiplied by t"),
    M("llm_lab", "Q1", "no_value_error", "apply_temperature",
      [("    if not t > 0:\n        raise ValueError(f\"temperature must be > 0, got {t}\")\n", "")],
      "must raise ValueError"),
    M("llm_lab", "Q1", "zero_temperature_allowed", "apply_temperature",
      [("if not t > 0:", "if t < 0:")], "t = 0 too (raise when t <= 0)"),
    M("llm_lab", "Q1", "divided_in_place", "apply_temperature",
      [("return logits / t", "return logits.div_(t)")], "do not change the input"),
    M("llm_lab", "Q1", "probabilities_returned", "apply_temperature",
      [("return logits / t", "return torch.softmax(logits / t, dim=-1)")], "apply_temperature returns probabilities"),

    M("llm_lab", "Q2", "kth_largest_dropped", "top_k_filter",
      [("logits.masked_fill(logits < kth_largest,", "logits.masked_fill(logits <= kth_largest,")],
      "the k-th largest is dropped"),
    M("llm_lab", "Q2", "others_set_to_zero", "top_k_filter",
      [('logits.masked_fill(logits < kth_largest, float("-inf"))', "logits.masked_fill(logits < kth_largest, 0.0)")],
      "not to 0"),
    M("llm_lab", "Q2", "smallest_kept", "top_k_filter",
      [("kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]",
        "kth_largest = torch.topk(logits, k, dim=-1, largest=False).values[..., -1:]"),
       ("logits.masked_fill(logits < kth_largest,", "logits.masked_fill(logits > kth_largest,")],
      "these are the smallest"),
    M("llm_lab", "Q2", "filled_in_place", "top_k_filter",
      [("return logits.masked_fill(logits < kth_largest,", "return logits.masked_fill_(logits < kth_largest,")],
      "do not change the input"),
    M("llm_lab", "Q2", "ties_dropped", "top_k_filter",
      [("kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)\n"
        '    return logits.masked_fill(logits < kth_largest, float("-inf"))',
        "keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, torch.topk(logits, k, dim=-1).indices, True)\n"
        '    return logits.masked_fill(~keep, float("-inf"))')],
      "ties with the k-th largest stay", "warn"),
    M("llm_lab", "Q2", "k_at_least_V_fails", "top_k_filter",
      [("    if k >= logits.size(-1):\n        return logits.clone()\n", "")], "k >= V keeps everything", "warn"),
    M("llm_lab", "Q2", "topk_over_the_batch", "top_k_filter",
      [("torch.topk(logits, k, dim=-1)", "torch.topk(logits, k, dim=0)")], "take the k largest of each row"),

    M("llm_lab", "Q3", "mass_includes_the_token", "top_p_filter",
      [(_TOPP_KEEP, "keep_sorted = torch.cumsum(sorted_probs, dim=-1) < p")], "compare cumsum - probs with p"),
    M("llm_lab", "Q3", "not_sorted", "top_p_filter",
      [("sorted_probs = torch.sort(probs, dim=-1, descending=True).values", "sorted_probs = probs"),
       ("return logits.masked_fill(probs < bar, float(\"-inf\"))", "return logits.masked_fill(~keep_sorted, float(\"-inf\"))")],
      "sort the probabilities in decreasing order"),
    M("llm_lab", "Q3", "mask_left_in_sorted_order", "top_p_filter",
      [("return logits.masked_fill(probs < bar, float(\"-inf\"))", "return logits.masked_fill(~keep_sorted, float(\"-inf\"))")],
      "the mask was computed in sorted order and applied in vocabulary order"),
    M("llm_lab", "Q3", "cumsum_of_logits", "top_p_filter",
      [("probs = F.softmax(logits, dim=-1)", "probs = logits")], "turn the logits into probabilities with a softmax"),
    M("llm_lab", "Q3", "ties_split", "top_p_filter",
      [("return logits.masked_fill(probs < bar, float(\"-inf\"))",
        "order = torch.sort(probs, dim=-1, descending=True).indices\n"
        "    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)\n"
        "    return logits.masked_fill(~keep, float(\"-inf\"))")],
      "the two with 0.25 are tied", "warn"),
    M("llm_lab", "Q3", "no_value_error", "top_p_filter",
      [("    if not 0 < p <= 1:\n        raise ValueError(f\"p must be in (0, 1], got {p}\")\n", "")],
      "must raise ValueError"),
    M("llm_lab", "Q3", "filled_in_place", "top_p_filter",
      [("return logits.masked_fill(probs < bar,", "return logits.masked_fill_(probs < bar,")], "do not change the input"),

    M("llm_lab", "Q4", "greedy_after_the_filters", "sample_next",
      [("    if temperature == 0:\n        return torch.argmax(logits, dim=-1)  # the first maximum on ties\n", ""),
       (_SAMPLE_FILTERS, _SAMPLE_FILTERS.replace("apply_temperature(logits, temperature)",
                                                 "apply_temperature(logits, temperature or 1.0)")
        + "    if temperature == 0:\n        return torch.argmax(logits, dim=-1)\n")],
      "greedy decoding (temperature 0) calls no filter"),
    M("llm_lab", "Q4", "filters_in_the_wrong_order", "sample_next",
      [(_SAMPLE_FILTERS, "    logits = apply_temperature(logits, temperature)\n"
                         "    if top_p is not None:\n        logits = top_p_filter(logits, top_p)\n"
                         "    if top_k is not None:\n        logits = top_k_filter(logits, top_k)\n")],
      "then top_k_filter(..., top_k), then top_p_filter"),
    M("llm_lab", "Q4", "filters_on_probabilities", "sample_next",
      [(_SAMPLE_FILTERS, "    logits = F.softmax(logits, dim=-1)\n" + _SAMPLE_FILTERS)],
      "apply_temperature must get the logits themselves"),
    M("llm_lab", "Q4", "no_softmax", "sample_next",
      [("probs = F.softmax(logits, dim=-1)", "probs = logits")], "apply a softmax to the filtered logits first"),
    M("llm_lab", "Q4", "generator_not_passed", "sample_next",
      [("num_samples=1, generator=generator)", "num_samples=1)")], "generator=generator"),
    M("llm_lab", "Q4", "no_reshape", "sample_next",
      [("torch.multinomial(probs.reshape(-1, V), num_samples=1, generator=generator)",
        "torch.multinomial(probs, num_samples=1, generator=generator)")],
      "reshape the probabilities to (-1, V)"),
    M("llm_lab", "Q4", "always_greedy", "sample_next",
      [("    picked = torch.multinomial(probs.reshape(-1, V), num_samples=1, generator=generator)  # (N, 1)\n",
        "    picked = probs.reshape(-1, V).argmax(-1)\n")],
      "this is the argmax; sample for temperature > 0"),

    M("llm_lab", "Q5", "prompt_returned_too", "generate_tokens",
      [("return ids[:, prompt_ids.size(1):]", "return ids")], "the prompt is included"),
    M("llm_lab", "Q5", "last_token_only", "generate_tokens",
      [("logits = next_logits(ids)  # (B, V)", "logits = next_logits(ids[:, -1:])  # (B, V)")],
      "feed the prompt plus the tokens so far"),
    M("llm_lab", "Q5", "prompt_only", "generate_tokens",
      [("logits = next_logits(ids)  # (B, V)", "logits = next_logits(prompt_ids)  # (B, V)")],
      "feed the prompt plus the tokens so far"),
    M("llm_lab", "Q5", "settings_not_passed", "generate_tokens",
      [("nxt = sample_next(logits, generator, temperature, top_k, top_p)", "nxt = sample_next(logits, generator)")],
      "pass generator, temperature, top_k and top_p on to sample_next", "warn"),
    M("llm_lab", "Q5", "negative_slice", "generate_tokens",
      [("return ids[:, prompt_ids.size(1):]", "return ids[:, -max_new_tokens:]")],
      "ids[:, -max_new_tokens:] is all of ids", "warn"),
    M("llm_lab", "Q5", "model_called_twice", "generate_tokens",
      [("logits = next_logits(ids)  # (B, V)", "next_logits(ids)\n        logits = next_logits(ids)  # (B, V)")],
      "call next_logits once per new token"),
]

# ---------------------------------------------------------------------------------------
# modern_decoder
# ---------------------------------------------------------------------------------------
_ROPE_THETA = "theta = base ** (-torch.arange(0, hs, 2, device=x.device, dtype=torch.float32) / hs)"
_ROPE_TURN = "x_even * cos - x_odd * sin, x_even * sin + x_odd * cos"
_GQA_KV = "C, kv = config.d_model, config.n_kv_head * self.head_size"
_GEN_STEP = "logits, cache = model(nxt, cache)"
_GQA_P = "P = 0 if past_kv is None else past_kv[0].size(2)"
_GQA_ROPE_K = "k = apply_rope(k, offset=P)"
_KV_SUM = "per_position = 2 * shape.n_layer * shape.n_kv_head * shape.head_size"

MODERN = [
    M("modern_decoder", "Q1", "rotate_half_pairing", "apply_rope",
      [("x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()", "x_even, x_odd = x.float().chunk(2, dim=-1)"),
       (f"y = torch.stack([{_ROPE_TURN}], dim=-1)", f"y = torch.cat([{_ROPE_TURN}], dim=-1)"),
       ("return y.flatten(-2).to(x.dtype)", "return y.to(x.dtype)")], "the rotate-half layout"),
    M("modern_decoder", "Q1", "turns_the_wrong_way", "apply_rope",
      [(_ROPE_TURN, "x_even * cos + x_odd * sin, -x_even * sin + x_odd * cos")], "the pairs turn the wrong way"),
    M("modern_decoder", "Q1", "exponent_i_over_hs", "apply_rope",
      [(_ROPE_THETA, "theta = base ** (-torch.arange(0, hs // 2, device=x.device, dtype=torch.float32) / hs)")],
      "pair i turns at base^(-i/hs)"),
    M("modern_decoder", "Q1", "exponent_doubled", "apply_rope",
      [(_ROPE_THETA, "theta = base ** (-2 * torch.arange(0, hs, 2, device=x.device, dtype=torch.float32) / hs)")],
      "base^(-4i/hs)"),
    M("modern_decoder", "Q1", "exponent_positive", "apply_rope",
      [(_ROPE_THETA, "theta = base ** (torch.arange(0, hs, 2, device=x.device, dtype=torch.float32) / hs)")],
      "base^(+2i/hs)"),
    M("modern_decoder", "Q1", "positions_start_at_one", "apply_rope",
      [("torch.arange(offset, offset + T,", "torch.arange(offset + 1, offset + T + 1,")],
      "position 0 must come back unchanged"),
    M("modern_decoder", "Q1", "offset_ignored", "apply_rope",
      [("torch.arange(offset, offset + T,", "torch.arange(0, T,")], "(offset is ignored)", "warn"),

    M("modern_decoder", "Q2", "kv_projections_full_width", "grouped_query_attention",
      [(_GQA_KV, "C, kv = config.d_model, config.d_model")], "k_proj and v_proj must produce n_kv_head * head_size"),
    M("modern_decoder", "Q2", "biases", "grouped_query_attention",
      [("self.q_proj = nn.Linear(C, C, bias=False)", "self.q_proj = nn.Linear(C, C)")], "have no biases"),
    M("modern_decoder", "Q2", "heads_grouped_by_modulo", "grouped_query_attention",
      [("k.repeat_interleave(group, dim=1)", "k.repeat(1, group, 1, 1)"),
       ("v.repeat_interleave(group, dim=1)", "v.repeat(1, group, 1, 1)")], "reads key-value head h % n_kv_head"),
    M("modern_decoder", "Q2", "no_causal_mask", "grouped_query_attention",
      [('scores = scores.masked_fill(~allowed, float("-inf"))', "pass")], "depends on later tokens"),
    M("modern_decoder", "Q2", "no_scaling", "grouped_query_attention",
      [("scores = q @ k_all.transpose(-2, -1) / math.sqrt(hs)", "scores = q @ k_all.transpose(-2, -1)")],
      "not divided by sqrt(head_size)"),
    M("modern_decoder", "Q2", "mask_aligned_top_left", "grouped_query_attention",
      [(".tril(diagonal=P)", ".tril()")], "aligned at the top left", "warn"),
    M("modern_decoder", "Q2", "cache_not_used", "grouped_query_attention",
      [(_GQA_P, "P = 0"), ("if past_kv is not None:", "if False:")], "the cached keys and values are not used", "warn"),
    M("modern_decoder", "Q2", "rope_on_values", "grouped_query_attention",
      [(_GQA_ROPE_K, _GQA_ROPE_K + "\n        v = apply_rope(v, offset=P)")], "apply_rope is applied to the values"),
    M("modern_decoder", "Q2", "new_keys_offset_zero", "grouped_query_attention",
      [(_GQA_ROPE_K, "k = apply_rope(k)")], "call apply_rope(..., offset=P)", "warn"),
    M("modern_decoder", "Q2", "cached_keys_rotated_twice", "grouped_query_attention",
      [(_GQA_ROPE_K, "pass"), ("S = P + T", "S = P + T\n        k = apply_rope(k)  # every key, the cached ones again")],
      "the cached keys are turned again", "warn"),
    M("modern_decoder", "Q2", "cache_after_repeat", "grouped_query_attention",
      [("return self.out_proj(y), (k, v)", "return self.out_proj(y), (k_all, v_all)")],
      "before repeating them for the query heads", "warn"),

    M("modern_decoder", "Q3", "no_cache", "generate_with_cache",
      [(_GEN_STEP, "logits, cache = model(ids, None)")], "the cache is never passed"),
    M("modern_decoder", "Q3", "whole_text_with_cache", "generate_with_cache",
      [(_GEN_STEP, "logits, cache = model(ids, cache)")], "pass only the newest token"),
    M("modern_decoder", "Q3", "call_after_last_token", "generate_with_cache",
      [("if step < max_new_tokens - 1:", "if True:")], "called once more after the last new token"),
    M("modern_decoder", "Q3", "first_position_logits", "generate_with_cache",
      [("logits[:, -1].argmax", "logits[:, 0].argmax")], "logits[:, -1]"),
    M("modern_decoder", "Q3", "new_tokens_only", "generate_with_cache",
      [("    return ids\n", "    return ids[:, prompt_ids.size(1):]\n")], "not the new tokens only"),

    M("modern_decoder", "Q4", "values_forgotten", "kv_cache_bytes",
      [(_KV_SUM, "per_position = shape.n_layer * shape.n_kv_head * shape.head_size")], "only the keys are counted"),
    M("modern_decoder", "Q4", "query_heads", "kv_cache_bytes",
      [(_KV_SUM, "per_position = 2 * shape.n_layer * shape.n_head * shape.head_size")], "n_head is used"),
    M("modern_decoder", "Q4", "head_size_from_width", "kv_cache_bytes",
      [(_KV_SUM, "per_position = 2 * shape.n_layer * shape.n_kv_head * (shape.d_model // shape.n_head)")],
      "the head size is taken as d_model // n_head"),
    M("modern_decoder", "Q4", "query_heads_keys_only", "kv_cache_bytes",  # cancel where n_head = 2 n_kv_head
      [(_KV_SUM, "per_position = shape.n_layer * shape.n_head * shape.head_size")],
      "two mistakes: only the keys are counted: the cache holds a key and a value vector (factor 2); "
      "and n_head is used"),
    M("modern_decoder", "Q4", "model_width", "kv_cache_bytes",
      [(_KV_SUM, "per_position = 2 * shape.n_layer * shape.d_model")], "d_model is used (2 * n_layer * d_model"),
    M("modern_decoder", "Q4", "float_result", "kv_cache_bytes",
      [("return per_position * seq_len * batch_size * bytes_per_value",
        "return per_position * seq_len * batch_size * bytes_per_value / 1")], "return a Python int"),
    M("modern_decoder", "Q4", "counted_with_torch", "kv_cache_bytes",
      [("return per_position * seq_len * batch_size * bytes_per_value",
        "return int(torch.tensor(per_position * seq_len * batch_size * bytes_per_value))")], "without PyTorch"),
]

# ---------------------------------------------------------------------------------------
# post_training
# ---------------------------------------------------------------------------------------
_SFT_ANSWER = "(positions >= prompt_lengths[:, None].to(input_ids.device)) & attention_mask.bool()"
_LORA_FREEZE = "for p in self.base.parameters():\n            p.requires_grad_(False)"
_LORA_MERGE = "out.weight.copy_(base.weight + self.scaling * (self.lora_B @ self.lora_A))"
_COUNT_QKV = "q, kv = shape.n_head * shape.head_size, shape.n_kv_head * shape.head_size"
_COUNT_ONE = "r * (sizes[name][0] + sizes[name][1])"
_COUNT_RET = "return shape.n_layer * per_block"
_DPO_RET = "return -F.logsigmoid(beta * (chosen - rejected)).mean()"
_DPO_W, _DPO_L = "chosen = policy_chosen_logps - ref_chosen_logps.detach()", "rejected = policy_rejected_logps - ref_rejected_logps.detach()"

POST = [
    M("post_training", "Q1", "logits_not_shifted", "answer_only_loss",
      [("targets = input_ids[:, 1:]", "targets = input_ids"), ("scored = is_answer[:, 1:]", "scored = is_answer"),
       ("logits[:, :-1].flatten(0, 1)", "logits.flatten(0, 1)")], "the logits are not shifted"),
    M("post_training", "Q1", "shifted_the_wrong_way", "answer_only_loss",
      [("targets = input_ids[:, 1:]", "targets = input_ids[:, :-1]"), ("scored = is_answer[:, 1:]", "scored = is_answer[:, :-1]"),
       ("logits[:, :-1].flatten(0, 1)", "logits[:, 1:].flatten(0, 1)")], "shifted the wrong way"),
    M("post_training", "Q1", "mask_aligned_with_logits", "answer_only_loss",
      [("scored = is_answer[:, 1:]", "scored = is_answer[:, :-1]")], "the mask is aligned with the logits"),
    M("post_training", "Q1", "answer_masked", "answer_only_loss",
      [(_SFT_ANSWER, _SFT_ANSWER.replace(">=", "<"))], "the answer is masked and the prompt scored"),
    M("post_training", "Q1", "prompt_scored", "answer_only_loss",
      [(_SFT_ANSWER, "attention_mask.bool()")], "the prompt tokens are scored too"),
    M("post_training", "Q1", "padding_scored", "answer_only_loss",
      [(_SFT_ANSWER, "(positions >= prompt_lengths[:, None].to(input_ids.device))")], "padding positions are scored"),
    M("post_training", "Q1", "divided_by_all_positions", "answer_only_loss",
      [("return losses[scored.flatten()].mean()", "return (losses * scored.flatten()).sum() / losses.numel()")],
      "divided by all B * (T - 1) positions"),
    M("post_training", "Q1", "mean_of_sequence_means", "answer_only_loss",
      [("return losses[scored.flatten()].mean()", "return ((losses.view(scored.shape) * scored).sum(1) / scored.sum(1)).mean()")],
      "each sequence's mean is averaged over the batch"),

    M("post_training", "Q2", "base_not_frozen", "lora_linear",
      [(_LORA_FREEZE, "pass")], "the base layer is not frozen"),
    M("post_training", "Q2", "shapes_swapped", "lora_linear",
      [("torch.randn(r, base.in_features,", "torch.randn(base.in_features, r,"),
       ("torch.zeros(base.out_features, r,", "torch.zeros(r, base.out_features,"),
       ("x @ self.lora_A.T @ self.lora_B.T", "x @ self.lora_A @ self.lora_B"),
       ("(self.lora_B @ self.lora_A)", "(self.lora_A @ self.lora_B).T")], "the shapes are swapped"),
    M("post_training", "Q2", "B_starts_random", "lora_linear",
      [("torch.zeros(base.out_features, r,", "torch.randn(base.out_features, r,")], "lora_B must start at zero"),
    M("post_training", "Q2", "A_starts_at_zero", "lora_linear",
      [("torch.randn(r, base.in_features,", "torch.zeros(r, base.in_features,")], "lora_A must start random"),
    M("post_training", "Q2", "scaled_by_alpha", "lora_linear",
      [("self.scaling = alpha / r", "self.scaling = alpha")], "the update is scaled by alpha;"),
    M("post_training", "Q2", "not_scaled", "lora_linear",
      [("self.scaling = alpha / r", "self.scaling = 1")], "the update is not scaled"),
    M("post_training", "Q2", "scaled_by_r_over_alpha", "lora_linear",
      [("self.scaling = alpha / r", "self.scaling = r / alpha")], "the update is scaled by r / alpha"),
    M("post_training", "Q2", "scaled_by_alpha_over_sqrt_r", "lora_linear",
      [("self.scaling = alpha / r", "self.scaling = alpha / math.sqrt(r)")], "alpha / sqrt(r) (rsLoRA)"),
    M("post_training", "Q2", "merge_not_scaled", "lora_linear",
      [(_LORA_MERGE, "out.weight.copy_(base.weight + self.lora_B @ self.lora_A)")], "merged() gives other outputs"),
    M("post_training", "Q2", "merge_drops_bias", "lora_linear",
      [("bias=base.bias is not None,", "bias=False,"), ("if base.bias is not None:", "if False:")], "(the bias is missing)"),
    M("post_training", "Q2", "merge_in_place", "lora_linear",
      [(_LORA_MERGE, "base.weight += self.scaling * (self.lora_B @ self.lora_A)\n            out.weight.copy_(base.weight)")],
      "merged() changed the base layer's weight"),

    M("post_training", "Q3", "kv_with_query_heads", "lora_trainable_parameters",
      [(_COUNT_QKV, "q, kv = shape.n_head * shape.head_size, shape.n_head * shape.head_size")],
      "k_proj and v_proj are counted with n_head heads"),
    M("post_training", "Q3", "square_projections", "lora_trainable_parameters",
      [(_COUNT_QKV, "q, kv = shape.d_model, shape.d_model")], "every projection is counted as d_model x d_model"),
    M("post_training", "Q3", "query_width_is_model_width", "lora_trainable_parameters",
      [(_COUNT_QKV, "q, kv = shape.d_model, shape.n_kv_head * shape.head_size")], "n_head * head_size is taken to be d_model"),
    M("post_training", "Q3", "head_size_from_width", "lora_trainable_parameters",
      [(_COUNT_QKV, "q, kv = shape.d_model, shape.n_kv_head * (shape.d_model // shape.n_head)")],
      "the head size is taken as d_model // n_head"),
    M("post_training", "Q3", "frozen_weights_counted", "lora_trainable_parameters",
      [(_COUNT_ONE, "sizes[name][0] * sizes[name][1]")], "the frozen weights (in x out) are counted"),
    M("post_training", "Q3", "A_only", "lora_trainable_parameters",
      [(_COUNT_ONE, "r * sizes[name][0]")], "only A (r x in) is counted"),
    M("post_training", "Q3", "layers_ignored", "lora_trainable_parameters",
      [(_COUNT_RET, "return per_block")], "n_layer is not used"),
    M("post_training", "Q3", "targets_ignored", "lora_trainable_parameters",
      [("for name in target_modules", 'for name in ["q_proj", "k_proj", "v_proj", "o_proj"]')],
      "count only the modules listed in target_modules"),
    M("post_training", "Q3", "float_result", "lora_trainable_parameters",
      [(_COUNT_RET, _COUNT_RET + " / 1")], "return a Python int"),
    M("post_training", "Q3", "counted_with_torch", "lora_trainable_parameters",
      [(_COUNT_RET, "return int(torch.tensor(shape.n_layer * per_block))")], "without PyTorch"),

    M("post_training", "Q4", "sign_flipped", "dpo_loss",
      [(_DPO_RET, "return -F.logsigmoid(beta * (rejected - chosen)).mean()")], "the sign is flipped"),
    M("post_training", "Q4", "beta_ignored", "dpo_loss",
      [(_DPO_RET, "return -F.logsigmoid(chosen - rejected).mean()")], "beta is not used"),
    M("post_training", "Q4", "beta_outside_the_sigmoid", "dpo_loss",
      [(_DPO_RET, "return -beta * F.logsigmoid(chosen - rejected).mean()")], "beta multiplies the loss"),
    M("post_training", "Q4", "reference_ignored", "dpo_loss",
      [(_DPO_W, "chosen = policy_chosen_logps"), (_DPO_L, "rejected = policy_rejected_logps")], "the reference is not used"),
    M("post_training", "Q4", "summed_over_the_batch", "dpo_loss",
      [(_DPO_RET, _DPO_RET.replace(".mean()", ".sum()"))], "the loss is summed over the batch"),
    M("post_training", "Q4", "reference_not_detached", "dpo_loss",
      [(_DPO_W, _DPO_W.replace(".detach()", "")), (_DPO_L, _DPO_L.replace(".detach()", ""))],
      "the reference's log-probabilities get a gradient"),
]

# ---------------------------------------------------------------------------------------
# Mistakes only a hidden test catches: the answer is right on every input the visible tests
# use and wrong on the other shapes and configurations the hidden tests draw.  A visible check
# for them would have to be the hidden test itself.
# ---------------------------------------------------------------------------------------
HIDDEN = [
    H("attention", "Q2", "mask_reshaped_to_T_by_S", "calculate_multihead_attention",
      [('scores = scores.masked_fill(~mask, float("-inf"))',
        'scores = scores.masked_fill(~mask.reshape(1, 1, *scores.shape[-2:]), float("-inf"))')],
      "right for the causal (T, T) mask of the visible test and the worked example; a padding mask (B, 1, 1, S) "
      "cannot be reshaped to (T, S). The question allows any mask that broadcasts; the hidden test uses padding masks."),
    H("attention", "Q3", "mask_reshaped_to_T_by_S", "multi_head_attention",
      [('scores = scores.masked_fill(~mask, float("-inf"))',
        'scores = scores.masked_fill(~mask.reshape(1, 1, T, S), float("-inf"))')],
      "as in Q2: the visible test and the example use a causal mask only; the hidden test adds padding masks."),
    H("llm_lab", "Q2", "rows_assumed_2d", "top_k_filter",
      [("torch.topk(logits, k, dim=-1).values[..., -1:]", "torch.topk(logits, k, dim=-1).values[:, -1:]")],
      "right for the (B, V) logits of the visible test; the question allows (..., V), and the hidden test uses "
      "3-D and 1-D logits, where [:, -1:] takes the wrong slice."),
    H("llm_lab", "Q3", "top_token_kept_only_in_2d", "top_p_filter",
      [("keep_sorted[..., 0] = True", "keep_sorted[:, 0] = True")],
      "right for the (B, V) logits of the visible test; the hidden test uses 1-D and 3-D logits, where [:, 0] is "
      "not the most probable token of each row."),
    H("concepts", "Q12", "mask_reset_to_one", "head_importance",
      [("mask[h] = saved", "mask[h] = 1.0")],
      "the visible model has every head mask at 1, so resetting to 1 and restoring the old value agree; the hidden "
      "test sets one mask to 0.5 first."),
    H("modern_decoder", "Q1", "base_ignored", "apply_rope",
      [("theta = base ** (", "theta = 10000.0 ** (")],
      "right for the default base of the visible test and the worked example; the hidden test also uses "
      "base 500,000 (the value Llama 3 uses), where a fixed 10,000 turns the pairs too fast."),
    H("modern_decoder", "Q4", "batch_ignored", "kv_cache_bytes",
      [("return per_position * seq_len * batch_size * bytes_per_value",
        "return per_position * seq_len * bytes_per_value")],
      "the visible test counts one sequence; the hidden test serves batches of 3 and 16, each with a cache of its own."),
    H("post_training", "Q2", "bias_assumed", "lora_linear",
      [(_LORA_FREEZE, "self.base.weight.requires_grad_(False)\n        self.base.bias.requires_grad_(False)")],
      "right for the base with a bias of the visible test and the worked example; the hidden test also adapts layers "
      "without a bias (as the projections of Llama are), where base.bias is None."),
    H("post_training", "Q2", "dtype_ignored", "lora_linear",
      [("device=w.device, dtype=w.dtype)", "device=w.device)")],
      "right for the float32 layers of the visible test; the hidden test adapts float64 layers, where float32 adapters "
      "do not match the base's dtype."),
    H("post_training", "Q4", "log_of_sigmoid", "dpo_loss",
      [(_DPO_RET, "return -torch.log(torch.sigmoid(beta * (chosen - rejected))).mean()")],
      "right for the small margins of the visible test and the worked example; the hidden test uses whole-answer "
      "log-probabilities in the hundreds, where sigmoid underflows to 0 and the loss becomes infinite."),
]

_ALL = ATTENTION + FINETUNE + AETHER + PLORA + CONCEPTS + LLM_LAB + MODERN + POST + HIDDEN
CAUGHT = [m for m in _ALL if m.kind != "hidden"]
HIDDEN_ONLY = [m for m in _ALL if m.kind == "hidden"]


# ---------------------------------------------------------------------------------------
# docs/MISTAKES.md: `python tests/mistakes_catalogue.py` rewrites its tables
# ---------------------------------------------------------------------------------------
DOC_START, DOC_END = "<!-- mistakes:start -->", "<!-- mistakes:end -->"


def _shown(line: str) -> str:
    """A flagged line of check() as a table cell: without the mark, the points and the tail."""
    import re

    line = re.sub(r"^\[(FAIL|WARN)\]\s*(visible \([^)]*\):\s*)?", "", line)
    line = re.sub(r"\s*\(no points lost here, but a hidden test of Q\d+ will fail\)$", "", line)
    return line.replace("|", "\\|")


def tables() -> str:
    """The per-question tables of docs/MISTAKES.md, with what check() prints for each mistake."""
    import json
    from pathlib import Path

    from test_mistakes import blocks, flagged, notebook, replacements

    root = Path(__file__).resolve().parent.parent
    out = []
    for name in dict.fromkeys(m.assignment for m in _ALL):
        titles = json.loads((root / "coursekit" / "checks" / f"{name}.json").read_text()).get("titles", {})
        out.append(f"### `{name}`\n")
        for q in sorted({m.question for m in _ALL if m.assignment == name}, key=lambda q: int(q[1:])):
            out.append(f"**{q}. {titles.get(q, '')}**\n")
            out.append("| mistake | flagged as | what `check()` prints first for the question |")
            out.append("|---|---|---|")
            for m in (m for m in _ALL if m.assignment == name and m.question == q):
                if m.kind == "hidden":
                    out.append(f"| `{m.name}` | hidden test only | (nothing: see below) |")
                    continue
                run = notebook(name)
                lines = flagged(blocks(run.check(q, replace=replacements(run, m))).get(q, []))
                mark = "failing visible test" if m.kind == "fail" else "warning"
                out.append(f"| `{m.name}` | {mark} | {_shown(lines[0]) if lines else '(not flagged!)'} |")
            out.append("")
    out.append("### Mistakes only a hidden test catches\n")
    out.append("| assignment | question | mistake | why no visible check flags it |")
    out.append("|---|---|---|---|")
    for m in HIDDEN_ONLY:
        out.append(f"| `{m.assignment}` | {m.question} | `{m.name}` | {m.why_hidden} |")
    return "\n".join(out)


if __name__ == "__main__":
    import os
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    os.chdir(here)
    doc = here.parent / "docs" / "MISTAKES.md"
    text = doc.read_text()
    head, rest = text.split(DOC_START, 1)
    tail = rest.split(DOC_END, 1)[1]
    doc.write_text(f"{head}{DOC_START}\n{tables()}\n{DOC_END}{tail}")
    print(f"wrote {doc}")
