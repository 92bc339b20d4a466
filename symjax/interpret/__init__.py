"""Reading symjax models: a named cache and hooks on every site, traces and lenses, the exact mixture trace,
interventions, attributions, head finding, the program view and an HTML report; ``HookedModel`` holds a
model, its parameters and its tokenizer for TransformerLens's calls.
``python -m symjax.report --workdir=... --input=...`` writes the report."""

from symjax.interpret.attribution import (
                                          evaluate_importance,
                                          gradient_importance,
                                          group_attribution,
                                          native_importance,
                                          stream_ablations,
                                          stream_attribution,
)
from symjax.interpret.circuits import (
                                          detect_head,
                                          find_induction_circuit,
                                          format_program,
                                          induction_scores,
                                          previous_token_scores,
                                          program,
)
from symjax.interpret.core import analysis_model, channel_lens, head_parameters, readout
from symjax.interpret.grid import sweep_hooks
from symjax.interpret.hooked import HookedModel
from symjax.interpret.hooks import (
                                          Cache,
                                          apply_with_hooks,
                                          attribution_patch,
                                          run_with_cache,
                                          run_with_hooks,
                                          site_gradients,
                                          valid_names,
                                          zero_head,
)
from symjax.interpret.interventions import Ablation, capture, effect, run_with
from symjax.interpret.mixtures import MixtureTrace, mixture_trace, reconstruction_error, reconstruction_errors
from symjax.interpret.patching import (
                                          Sweep,
                                          get_act_patch_attn_head_out_all_pos,
                                          get_act_patch_attn_head_out_by_pos,
                                          get_act_patch_attn_out,
                                          get_act_patch_block_every,
                                          get_act_patch_mlp_out,
                                          get_act_patch_resid_mid,
                                          get_act_patch_resid_post,
                                          get_act_patch_resid_pre,
                                          logit_difference,
                                          patch,
                                          patch_many,
                                          sweep_heads,
                                          sweep_positions,
)
from symjax.interpret.tracing import Trace, cone, trace
from symjax.model.intermediates import HookName as HookPoint
from symjax.model.intermediates import get_act_name

__all__ = [
    'Ablation', 'Cache', 'HookedModel', 'MixtureTrace', 'Trace', 'analysis_model', 'apply_with_hooks',
    'attribution_patch', 'capture', 'channel_lens', 'cone', 'detect_head', 'effect', 'site_gradients',
    'evaluate_importance', 'find_induction_circuit', 'format_program', 'gradient_importance',
    'group_attribution', 'head_parameters', 'induction_scores', 'mixture_trace', 'native_importance',
    'previous_token_scores', 'program', 'readout', 'reconstruction_error', 'reconstruction_errors',
    'run_with', 'run_with_cache', 'run_with_hooks', 'stream_ablations', 'stream_attribution', 'trace',
    'valid_names', 'zero_head', 'Sweep', 'logit_difference', 'patch', 'patch_many', 'sweep_heads',
    'sweep_positions', 'get_act_patch_resid_pre', 'get_act_patch_resid_mid', 'get_act_patch_resid_post',
    'get_act_patch_attn_out', 'get_act_patch_mlp_out', 'get_act_patch_attn_head_out_all_pos',
    'get_act_patch_attn_head_out_by_pos', 'get_act_patch_block_every', 'sweep_hooks', 'HookPoint', 'get_act_name',
]
