"""TransformerLens's own hook and patching examples, run on a small trained symjax model.

The cells below are those of TransformerLens's "Main Demo" (head ablation, residual-stream patching, induction
scores, a name filter) and "Exploratory Analysis Demo" (activation patching of the residual stream, of attention
and MLP outputs, of heads' outputs, values and patterns), as written there. What changed: the imports
(TransformerLens's ``utils.get_act_name`` and ``HookPoint`` are symjax's), the model's construction
(``HookedModel(run, tensors='torch')``: torch tensors in and out, as TransformerLens gives them), and the data a
GPT-2 prompt held (prompts, answers and token ranges in this model's vocabulary). Each result is then checked
against the same quantity from symjax's own functions.

They need PyTorch, einops and jaxtyping (the ``bench`` extra installs them, as TransformerLens does); without them
the module is skipped.
"""

import numpy as np
import pytest

torch = pytest.importorskip('torch')
einops = pytest.importorskip('einops')
pytest.importorskip('jaxtyping')

import symjax  # noqa: E402
import symjax.configs as configs  # noqa: E402
from symjax import interpret  # noqa: E402
from symjax.interpret import HookedModel, patching  # noqa: E402
from symjax.train import config as config_lib  # noqa: E402
from symjax.train import trainer as train  # noqa: E402

pytestmark = pytest.mark.slow

# The demos' imports, changed: TransformerLens's name helper and hook type are symjax's.
IMPORTS = """
from functools import partial
import numpy as np
import torch
import einops
import tqdm
from types import SimpleNamespace
from jaxtyping import Float
from symjax.interpret import HookPoint, get_act_name
utils = SimpleNamespace(get_act_name=get_act_name)
"""

# Main Demo, cells 31, 35, 37, 44 and 46 (prompts, answers and token ranges: this model's).
MAIN_DEMO = '''
gpt2_tokens = model.to_tokens("<s> a 1 b 2 c 3 d 0 a 1 b 2 c")
layer_to_ablate = 0
head_index_to_ablate = 1


# We define a head ablation hook
# The type annotations are NOT necessary, they're just a useful guide to the reader
#
def head_ablation_hook(
    value: Float[torch.Tensor, "batch pos head_index d_head"], hook: HookPoint
) -> Float[torch.Tensor, "batch pos head_index d_head"]:
    print(f"Shape of the value tensor: {value.shape}")
    value[:, :, head_index_to_ablate, :] = 0.0
    return value


original_loss = model(gpt2_tokens, return_type="loss")
ablated_loss = model.run_with_hooks(
    gpt2_tokens,
    return_type="loss",
    fwd_hooks=[(utils.get_act_name("v", layer_to_ablate), head_ablation_hook)],
)
print(f"Original Loss: {original_loss.item():.3f}")
print(f"Ablated Loss: {ablated_loss.item():.3f}")

clean_prompt = "<s> a 1 b 2 c 3 d 0 a"
corrupted_prompt = "<s> a 1 b 2 c 3 d 0 b"

clean_tokens = model.to_tokens(clean_prompt)
corrupted_tokens = model.to_tokens(corrupted_prompt)


def logits_to_logit_diff(logits, correct_answer=" 1", incorrect_answer=" 2"):
    # model.to_single_token maps a string value of a single token to the token index for that token
    # If the string is not a single token, it raises an error.
    correct_index = model.to_single_token(correct_answer)
    incorrect_index = model.to_single_token(incorrect_answer)
    return logits[0, -1, correct_index] - logits[0, -1, incorrect_index]


# We run on the clean prompt with the cache so we store activations to patch in later.
clean_logits, clean_cache = model.run_with_cache(clean_tokens)
clean_logit_diff = logits_to_logit_diff(clean_logits)
print(f"Clean logit difference: {clean_logit_diff.item():.3f}")

# We don't need to cache on the corrupted prompt.
corrupted_logits = model(corrupted_tokens)
corrupted_logit_diff = logits_to_logit_diff(corrupted_logits)
print(f"Corrupted logit difference: {corrupted_logit_diff.item():.3f}")


def residual_stream_patching_hook(
    resid_pre: Float[torch.Tensor, "batch pos d_model"], hook: HookPoint, position: int
) -> Float[torch.Tensor, "batch pos d_model"]:
    # Each HookPoint has a name attribute giving the name of the hook.
    clean_resid_pre = clean_cache[hook.name]
    resid_pre[:, position, :] = clean_resid_pre[:, position, :]
    return resid_pre


# We make a tensor to store the results for each patching run. We put it on the model's device to avoid needing to move things between the GPU and CPU, which can be slow.
num_positions = len(clean_tokens[0])
ioi_patching_result = torch.zeros((model.cfg.n_layers, num_positions), device=model.cfg.device)

for layer in tqdm.tqdm(range(model.cfg.n_layers)):
    for position in range(num_positions):
        # Use functools.partial to create a temporary hook function with the position fixed
        temp_hook_fn = partial(residual_stream_patching_hook, position=position)
        # Run the model with the patching hook
        patched_logits = model.run_with_hooks(
            corrupted_tokens, fwd_hooks=[(utils.get_act_name("in", layer), temp_hook_fn)]
        )
        # Calculate the logit difference
        patched_logit_diff = logits_to_logit_diff(patched_logits).detach()
        # Store the result, normalizing by the clean and corrupted logit difference so it's between 0 and 1 (ish)
        ioi_patching_result[layer, position] = (patched_logit_diff - corrupted_logit_diff) / (
            clean_logit_diff - corrupted_logit_diff
        )

batch_size = 10
seq_len = 20
size = (batch_size, seq_len)
input_tensor = torch.randint(4, 12, size)

random_tokens = input_tensor.to(model.cfg.device)
repeated_tokens = einops.repeat(random_tokens, "batch seq_len -> batch (2 seq_len)")
repeated_logits = model(repeated_tokens)
correct_log_probs = model.loss_fn(repeated_logits, repeated_tokens, per_token=True)
loss_by_position = einops.reduce(correct_log_probs, "batch position -> position", "mean")

# We make a tensor to store the induction score for each head. We put it on the model's device to avoid needing to move things between the GPU and CPU, which can be slow.
induction_score_store = torch.zeros(
    (model.cfg.n_layers, model.cfg.n_heads), device=model.cfg.device
)


def induction_score_hook(
    pattern: Float[torch.Tensor, "batch head_index dest_pos source_pos"],
    hook: HookPoint,
):
    # We take the diagonal of attention paid from each destination position to source positions seq_len-1 tokens back
    # (This only has entries for tokens with index>=seq_len)
    induction_stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
    # Get an average score per head
    induction_score = einops.reduce(
        induction_stripe, "batch head_index position -> head_index", "mean"
    )
    # Store the result.
    induction_score_store[hook.layer(), :] = induction_score


# We make a boolean filter on activation names, that's true only on attention pattern names.
pattern_hook_names_filter = lambda name: name.endswith("pattern")

model.run_with_hooks(
    repeated_tokens,
    return_type=None,  # For efficiency, we don't need to calculate the logits
    fwd_hooks=[(pattern_hook_names_filter, induction_score_hook)],
)

test_prompt = "<s> a 1 b 2 c 3"
print("Num tokens:", len(model.to_tokens(test_prompt)[0]))


def print_name_shape_hook_function(activation, hook):
    print(hook.name, activation.shape)


not_in_late_block_filter = lambda name: name.startswith("blocks.0.") or not name.startswith(
    "blocks"
)

model.run_with_hooks(
    test_prompt,
    return_type=None,
    fwd_hooks=[(not_in_late_block_filter, print_name_shape_hook_function)],
)
'''

# Exploratory Analysis Demo, cells 22, 26, 28, 59, 62, 63, 73, 74, 78 and 85 (the prompts: this model's).
EXPLORATORY_DEMO = '''
device = "cpu"
prompt_format = [
    "a 1 b 2 c 3 d 0{}",
    "b 2 c 3 a 1 d 0{}",
]
names = [
    (" a", " b"),
    (" c", " d"),
]
answer_of = {" a": " 1", " b": " 2", " c": " 3", " d": " 0"}
# List of prompts
prompts = []
# List of answers, in the format (correct, incorrect)
answers = []
# List of the token (ie an integer) corresponding to each answer, in the format (correct_token, incorrect_token)
answer_tokens = []
for i in range(len(prompt_format)):
    for j in range(2):
        answers.append((answer_of[names[i][j]], answer_of[names[i][1 - j]]))
        answer_tokens.append(
            (
                model.to_single_token(answers[-1][0]),
                model.to_single_token(answers[-1][1]),
            )
        )
        prompts.append(prompt_format[i].format(names[i][j]))
answer_tokens = torch.tensor(answer_tokens).to(device)

tokens = model.to_tokens(prompts, prepend_bos=True)

# Run the model and cache all activations
original_logits, cache = model.run_with_cache(tokens)


def logits_to_ave_logit_diff(logits, answer_tokens, per_prompt=False):
    # Only the final logits are relevant for the answer
    final_logits = logits[:, -1, :]
    answer_logits = final_logits.gather(dim=-1, index=answer_tokens)
    answer_logit_diff = answer_logits[:, 0] - answer_logits[:, 1]
    if per_prompt:
        return answer_logit_diff
    else:
        return answer_logit_diff.mean()


print(
    "Per prompt logit difference:",
    logits_to_ave_logit_diff(original_logits, answer_tokens, per_prompt=True)
    .detach()
    .cpu()
    .round(decimals=3),
)
original_average_logit_diff = logits_to_ave_logit_diff(original_logits, answer_tokens)

corrupted_prompts = []
for i in range(0, len(prompts), 2):
    corrupted_prompts.append(prompts[i + 1])
    corrupted_prompts.append(prompts[i])
corrupted_tokens = model.to_tokens(corrupted_prompts, prepend_bos=True)
corrupted_logits, corrupted_cache = model.run_with_cache(
    corrupted_tokens, return_type="logits"
)
corrupted_average_logit_diff = logits_to_ave_logit_diff(corrupted_logits, answer_tokens)
print("Corrupted Average Logit Diff", round(corrupted_average_logit_diff.item(), 2))
print("Clean Average Logit Diff", round(original_average_logit_diff.item(), 2))


def patch_residual_component(
    corrupted_residual_component: Float[torch.Tensor, "batch pos d_model"],
    hook,
    pos,
    clean_cache,
):
    clean_value = clean_cache[hook.name][:, pos, :].clone()
    corrupted_residual_component = corrupted_residual_component.clone()
    corrupted_residual_component[:, pos : pos + 1, :] = clean_value.unsqueeze(1)
    return corrupted_residual_component


def normalize_patched_logit_diff(patched_logit_diff):
    # Subtract corrupted logit diff to measure the improvement, divide by the total improvement from clean to corrupted to normalise
    # 0 means zero change, negative means actively made worse, 1 means totally recovered clean performance, >1 means actively *improved* on clean performance
    return (patched_logit_diff - corrupted_average_logit_diff) / (
        original_average_logit_diff - corrupted_average_logit_diff
    )


patched_residual_stream_diff = torch.zeros(
    model.cfg.n_layers, tokens.shape[1], device=device, dtype=torch.float32
)
for layer in range(model.cfg.n_layers):
    for position in range(tokens.shape[1]):
        hook_fn = partial(patch_residual_component, pos=position, clean_cache=cache)
        patched_logits = model.run_with_hooks(
            corrupted_tokens,
            fwd_hooks=[(utils.get_act_name("resid_pre", layer), hook_fn)],
            return_type="logits",
        )
        patched_logit_diff = logits_to_ave_logit_diff(patched_logits, answer_tokens)

        patched_residual_stream_diff[layer, position] = normalize_patched_logit_diff(
            patched_logit_diff
        )

patched_attn_diff = torch.zeros(
    model.cfg.n_layers, tokens.shape[1], device=device, dtype=torch.float32
)
patched_mlp_diff = torch.zeros(
    model.cfg.n_layers, tokens.shape[1], device=device, dtype=torch.float32
)
for layer in range(model.cfg.n_layers):
    for position in range(tokens.shape[1]):
        hook_fn = partial(patch_residual_component, pos=position, clean_cache=cache)
        patched_attn_logits = model.run_with_hooks(
            corrupted_tokens,
            fwd_hooks=[(utils.get_act_name("attn_out", layer), hook_fn)],
            return_type="logits",
        )
        patched_attn_logit_diff = logits_to_ave_logit_diff(
            patched_attn_logits, answer_tokens
        )
        patched_mlp_logits = model.run_with_hooks(
            corrupted_tokens,
            fwd_hooks=[(utils.get_act_name("mlp_out", layer), hook_fn)],
            return_type="logits",
        )
        patched_mlp_logit_diff = logits_to_ave_logit_diff(
            patched_mlp_logits, answer_tokens
        )

        patched_attn_diff[layer, position] = normalize_patched_logit_diff(
            patched_attn_logit_diff
        )
        patched_mlp_diff[layer, position] = normalize_patched_logit_diff(
            patched_mlp_logit_diff
        )


def patch_head_vector(
    corrupted_head_vector: Float[torch.Tensor, "batch pos head_index d_head"],
    hook,
    head_index,
    clean_cache,
):
    clean_value = clean_cache[hook.name][
        :, :, head_index, :
    ].clone()
    corrupted_head_vector = corrupted_head_vector.clone()
    corrupted_head_vector[:, :, head_index : head_index + 1, :] = clean_value.unsqueeze(2)
    return corrupted_head_vector


patched_head_z_diff = torch.zeros(
    model.cfg.n_layers, model.cfg.n_heads, device=device, dtype=torch.float32
)
for layer in range(model.cfg.n_layers):
    for head_index in range(model.cfg.n_heads):
        hook_fn = partial(patch_head_vector, head_index=head_index, clean_cache=cache)
        patched_logits = model.run_with_hooks(
            corrupted_tokens,
            fwd_hooks=[(utils.get_act_name("z", layer, "attn"), hook_fn)],
            return_type="logits",
        )
        patched_logit_diff = logits_to_ave_logit_diff(patched_logits, answer_tokens)

        patched_head_z_diff[layer, head_index] = normalize_patched_logit_diff(
            patched_logit_diff
        )

patched_head_v_diff = torch.zeros(
    model.cfg.n_layers, model.cfg.n_heads, device=device, dtype=torch.float32
)
for layer in range(model.cfg.n_layers):
    for head_index in range(model.cfg.n_heads):
        hook_fn = partial(patch_head_vector, head_index=head_index, clean_cache=cache)
        patched_logits = model.run_with_hooks(
            corrupted_tokens,
            fwd_hooks=[(utils.get_act_name("v", layer, "attn"), hook_fn)],
            return_type="logits",
        )
        patched_logit_diff = logits_to_ave_logit_diff(patched_logits, answer_tokens)

        patched_head_v_diff[layer, head_index] = normalize_patched_logit_diff(
            patched_logit_diff
        )


def patch_head_pattern(
    corrupted_head_pattern: Float[torch.Tensor, "batch head_index query_pos d_head"],
    hook,
    head_index,
    clean_cache,
):
    clean_value = clean_cache[hook.name][
        :, head_index, :, :
    ].clone()
    corrupted_head_pattern = corrupted_head_pattern.clone()
    corrupted_head_pattern[:, head_index : head_index + 1, :, :] = clean_value.unsqueeze(1)
    return corrupted_head_pattern


patched_head_attn_diff = torch.zeros(
    model.cfg.n_layers, model.cfg.n_heads, device=device, dtype=torch.float32
)
for layer in range(model.cfg.n_layers):
    for head_index in range(model.cfg.n_heads):
        hook_fn = partial(patch_head_pattern, head_index=head_index, clean_cache=cache)
        patched_logits = model.run_with_hooks(
            corrupted_tokens,
            fwd_hooks=[(utils.get_act_name("attn", layer, "attn"), hook_fn)],
            return_type="logits",
        )
        patched_logit_diff = logits_to_ave_logit_diff(patched_logits, answer_tokens)

        patched_head_attn_diff[layer, head_index] = normalize_patched_logit_diff(
            patched_logit_diff
        )
'''


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  config = config_lib.default_config(kind='standard', shape=configs.shape('tiny'))
  config.total_steps, config.warmup_steps, config.batch_size, config.eval_every_steps = 40, 5, 16, 40
  config.progress_bar = False
  workdir = str(tmp_path_factory.mktemp('tl_demos') / 'work')
  train.train_and_evaluate(config, workdir)
  return symjax.load(workdir)


def _demo(source: str, model) -> dict:
  scope = {'model': model}
  exec(IMPORTS, scope)
  exec(source, scope)
  return scope


def test_the_main_demos_hooks_and_patching_run_as_written_and_give_symjaxs_values(run, capsys):
  hm = HookedModel(run, tensors='torch')
  scope = _demo(MAIN_DEMO, hm)
  printed = capsys.readouterr().out
  plain = HookedModel(run)
  tokens = np.asarray(scope['gpt2_tokens'])
  # The in-place head ablation is zero_head's.
  want = plain.run_with_hooks(tokens, {'blocks.0.attn.values': interpret.zero_head(1)}, return_type='loss')
  assert isinstance(scope['ablated_loss'], torch.Tensor) and scope['ablated_loss'].item() == pytest.approx(want, 1e-5)
  assert scope['original_loss'].item() == pytest.approx(plain(tokens, return_type='loss'), 1e-5)
  assert 'Shape of the value tensor: (1, 14, 2, ' in printed
  # Residual-stream patching, position by position: symjax's sweep.
  clean, corrupt = np.asarray(scope['clean_tokens']), np.asarray(scope['corrupted_tokens'])
  one, two = plain.to_single_token('1'), plain.to_single_token('2')
  metric = patching.logit_difference(one, two)
  sweep = patching.get_act_patch_resid_pre(plain, clean, corrupt, metric=metric)
  base, top = metric(plain(corrupt)), metric(plain(clean))
  np.testing.assert_allclose(scope['ioi_patching_result'].numpy(), (sweep - base) / (top - base), atol=1e-4)
  # Induction scores through a hook that writes to a torch tensor: the cache's patterns read the same way.
  _, cache = plain.run_with_cache(np.asarray(scope['repeated_tokens']))
  seq_len = scope['seq_len']
  for layer in range(plain.cfg.n_layers):
    pattern = cache[f'blocks.{layer}.attn.pattern']
    stripe = np.diagonal(pattern, offset=1 - seq_len, axis1=-2, axis2=-1).mean(axis=(0, 2))
    np.testing.assert_allclose(scope['induction_score_store'][layer].numpy(), stripe, atol=1e-5)
  logp = scope['correct_log_probs'].numpy()
  assert logp.shape == (10, 2 * seq_len - 1)
  assert logp.mean() == pytest.approx(plain(np.asarray(scope['repeated_tokens']), return_type='loss'), 1e-4)
  # The name filter's hook printed block 0's sites (and those outside the blocks), no later block's.
  assert 'blocks.0.attn.pattern (1, 2, 7, 7)' in printed and 'blocks.1.attn.pattern' not in printed


def test_the_exploratory_demos_activation_patching_runs_as_written_and_gives_symjaxs_values(run):
  hm = HookedModel(run, tensors='torch')
  scope = _demo(EXPLORATORY_DEMO, hm)
  plain = HookedModel(run)
  clean, corrupt = np.asarray(scope['tokens']), np.asarray(scope['corrupted_tokens'])
  answers = scope['answer_tokens'].numpy()
  metric = patching.logit_difference(answers[:, 0], answers[:, 1])
  base, top = metric(plain(corrupt)), metric(plain(clean))
  norm = lambda x: (x - base) / (top - base)
  layers, heads, time = plain.cfg.n_layers, plain.cfg.n_heads, clean.shape[1]
  for name, family in (('patched_residual_stream_diff', patching.get_act_patch_resid_pre),
                       ('patched_attn_diff', patching.get_act_patch_attn_out),
                       ('patched_mlp_diff', patching.get_act_patch_mlp_out)):
    want = family(plain, clean, corrupt, metric=metric)
    assert want.shape == (layers, time)
    np.testing.assert_allclose(scope[name].numpy(), norm(want), atol=1e-4)
  np.testing.assert_allclose(scope['patched_head_z_diff'].numpy(), norm(
      patching.get_act_patch_attn_head_out_all_pos(plain, clean, corrupt, metric=metric)), atol=1e-4)
  for name, site in (('patched_head_v_diff', 'attn.values'),
                     ('patched_head_attn_diff', 'attn.pattern')):
    want = [[patching.patch(plain.model, plain.params, clean, corrupt, f'blocks.{l}.{site}', heads=h,
                            metric=metric) for h in range(heads)] for l in range(layers)]
    np.testing.assert_allclose(scope[name].numpy(), norm(np.asarray(want)), atol=1e-4)
