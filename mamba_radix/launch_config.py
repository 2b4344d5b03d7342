"""SGLang launch settings (``sglang.launch_server --config FILE``) as this package's flags.

``mamba-radix simulate --config settings.json`` (and ``plan``, ``sweep``) reads the file a deployment
launches SGLang with and turns each key into the flag of the same name, so the simulated cache is the
deployed one. The rules:

- The file is a JSON object (the form seed 001 gives), or YAML as SGLang's own ``--config`` takes it when
  PyYAML is importable (else a one-line error: JSON only). Keys may use ``_`` or ``-`` (SGLang accepts both).
- A key whose flag the command has sets it (its value checked by the flag's own type), placed before the
  command line's flags so that a flag given there wins, as in SGLang (command line > file > defaults).
- ``model_path`` sets ``--model`` when its last path part names a model preset (``/models/kimi-k3``);
  ``enable_overlap_schedule: true`` means ``--disable-overlap-schedule false`` (SGLang's field is the
  negative one).
- Any other key SGLang's ``ServerArgs`` has (``host``, ``port``, ``cuda_graph_max_bs_decode``, or a flag
  another command has: ``dcp_size`` under ``simulate``) does not change what this command models: it is
  accepted and listed once as ignored. A ``null`` value is ignored too. (The speculative settings are
  ``simulate`` flags: they size its pools, and ``simulate`` says on stderr that they do nothing else.)
- Any other key is a typo: a one-line error naming it and the closest known key, and nothing runs.
- HiCache (SGLang's host tier): with ``enable_hierarchical_cache: true``, ``simulate`` and ``sweep`` get
  ``--host-memory-ratio`` from ``hicache_ratio`` (2, SGLang's default, when absent or null) and
  ``--host-write-policy`` from ``hicache_write_policy``; ``hicache_size`` (GB, which SGLang splits in
  proportion to the device pools' bytes) needs the device pools, so there it is refused in one line (give
  ``hicache_ratio``), while ``plan`` reads it as ``--host-memory-gb`` (GB -> GiB). An L3
  ``hicache_storage_backend`` is refused (not modelled). Without the switch the ``hicache_*`` keys change
  nothing (SGLang has no host tier then) and are listed as ignored.

No side effects beyond reading the file; nothing here imports torch or numpy (``--help`` loads it).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mamba_radix.errors import ConfigError

__all__ = ["SGLANG_SERVER_ARGS", "expand_config", "load_settings", "settings_to_argv"]

# The field names of SGLang's ServerArgs (python/sglang/srt/server_args.py at commit 526af15, Aug 2026): a
# key of a launch-settings file that is one of these is a real SGLang setting, not a typo.
_SERVER_ARG_NAMES = """
    abort_on_priority_when_disabled admin_api_key allow_auto_truncate allowed_media_domains api_key
    asr_max_buffer_seconds asr_max_concurrent_sessions attention_backend attn_cp_size base_gpu_id
    batch_notify_size bf16_gemm_backend bucket_e2e_request_latency bucket_inter_token_latency
    bucket_time_to_first_token c128_page_size chat_template checkpoint_engine_wait_weights_before_ready
    chunked_prefill_size completion_template constrained_json_disable_any_whitespace
    constrained_json_whitespace_pattern context_length cp_strategy cpu_offload_gb crash_dump_folder
    cuda_graph_backend_decode cuda_graph_backend_prefill cuda_graph_bs_decode cuda_graph_bs_prefill
    cuda_graph_config cuda_graph_max_bs_decode cuda_graph_max_bs_prefill cuda_graph_tc_compiler
    custom_sigquit_handler custom_weight_loader dcp_comm_backend dcp_replicate_q_proj dcp_size
    debug_cuda_graph debug_tensor_dump_input_file debug_tensor_dump_layers debug_tensor_dump_output_folder
    decode_attention_backend decode_log_interval decoupled_spec_bind_endpoint
    decoupled_spec_connect_endpoints decoupled_spec_rank decoupled_spec_role decrypted_config_file
    decrypted_draft_config_file deepep_config deepep_dispatcher_output_dtype deepep_mode
    default_chat_template_kwargs default_priority_value delete_ckpt_after_loading detokenizer_worker_num
    device disable_attn_tp_gather disable_chunked_prefix_cache disable_cuda_graph
    disable_cuda_graph_padding disable_custom_all_reduce disable_decode_cuda_graph
    disable_fast_image_processor disable_flashinfer_autotune disable_flashinfer_cutlass_moe_fp4_allgather
    disable_hybrid_swa_memory disable_outlines_disk_cache disable_overlap_schedule
    disable_prefill_cuda_graph disable_priority_preemption disable_radix_cache
    disable_shared_experts_fusion disable_tokenizer_batch_decode disaggregation_bootstrap_port
    disaggregation_decode_enable_offload_kvcache disaggregation_decode_enable_radix_cache
    disaggregation_decode_extra_slots disaggregation_decode_polling_interval
    disaggregation_decode_retraction_backup disaggregation_ib_device disaggregation_mode
    disaggregation_transfer_backend dist_init_addr dist_timeout dllm_algorithm dllm_algorithm_config
    dllm_fdfo download_dir dp_size dsa_decode_backend dsa_paged_mqa_logits_backend dsa_prefill_backend
    dsa_prefill_cp_mode dsa_topk_backend dtype dwdp_size dynamic_batch_tokenizer_batch_size
    dynamic_batch_tokenizer_batch_timeout elastic_ep_backend elastic_ep_initial_size elastic_ep_rejoin
    elastic_ep_scale_timeout enable_adaptive_dispatch_to_encoder enable_aiter_allreduce_fusion
    enable_attn_tp_input_scattered enable_broadcast_mm_inputs_process enable_cache_report
    enable_cp_decode_attn_tp enable_cudagraph_gc enable_custom_logit_processor
    enable_deepseek_v4_fp4_indexer enable_deterministic_inference enable_dp_attention
    enable_dp_attention_local_control_broadcast enable_dp_lm_head enable_draft_weights_cpu_backup
    enable_dsa_cache_layer_split enable_dsa_prefill_context_parallel enable_dynamic_batch_tokenizer
    enable_dynamic_chunking enable_elastic_expert_backup enable_eplb enable_flashinfer_allreduce_fusion
    enable_flexkv enable_forward_pass_metrics enable_fp32_lm_head enable_fused_moe_sum_all_reduce
    enable_fused_qk_norm_rope enable_hierarchical_cache enable_hisparse enable_http2
    enable_int8_mamba_checkpoint enable_layerwise_nvtx_marker enable_linear_replayssm
    enable_linear_replayssm_spec enable_lmcache enable_lora enable_lora_overlap_loading
    enable_mamba_cache_stochastic_rounding enable_memory_saver enable_metrics
    enable_metrics_for_all_schedulers enable_mfu_metrics enable_mis enable_mixed_chunk
    enable_mm_global_cache enable_mscclpp enable_multi_layer_eagle enable_multimodal enable_nccl_nvls
    enable_p2p_check enable_page_major_kv_layout enable_pdmux enable_precise_embedding_interpolation
    enable_prefill_context_parallel enable_prefill_cp enable_prefill_delayer enable_prefix_mm_cache
    enable_priority_scheduling enable_profile_cuda_graph enable_quant_communications
    enable_request_time_stats_logging enable_return_hidden_states enable_return_indexer_topk
    enable_return_routed_experts enable_scattered_sconv enable_session_radix_cache
    enable_single_batch_overlap enable_ssl_refresh enable_streaming_session enable_strict_thinking
    enable_symm_mem enable_tf32_matmul enable_tokenizer_batch_encode enable_torch_compile
    enable_torch_compile_debug_mode enable_torch_symm_mem enable_tp_lm_head_all_to_all enable_trace
    enable_two_batch_overlap enable_unified_memory enable_waterfill enable_weights_cpu_backup
    encoder_bootstrap_port encoder_only encoder_register_urls encoder_transfer_backend encoder_urls
    enforce_disable_flashinfer_allreduce_fusion enforce_shared_experts_fusion engine_info_bootstrap_port
    ep_dispatch_algorithm ep_join_mode ep_join_rank_offset ep_num_redundant_experts ep_size eplb_algorithm
    eplb_min_rebalancing_utilization_threshold eplb_rebalance_layers_per_chunk
    eplb_rebalance_num_iterations expert_balancedness_report_mode expert_distribution_recorder_buffer_size
    expert_distribution_recorder_mode experts_shared_outer_loras export_metrics_to_file
    export_metrics_to_file_dir extra_metric_labels fastapi_root_path file_storage_path
    flashinfer_allreduce_fusion_backend flashinfer_autotune_skip_ops flashinfer_mla_disable_ragged
    flashinfer_mxfp4_moe_precision flexkv_config_file forward_hooks forward_pass_metrics_ipc_name
    forward_pass_metrics_worker_id fp4_gemm_runner_backend fp8_gemm_runner_backend fuseep_mode gc_threshold
    gc_warning_threshold_secs generation_tokens_buckets gpu_id_step grammar_backend grpc_mode grpc_port
    hf_chat_template_name hicache_io_backend hicache_mem_layout hicache_ratio hicache_size
    hicache_storage_backend hicache_storage_backend_extra_config hicache_storage_prefetch_policy
    hicache_write_policy hisparse_config host http2_max_concurrent_streams image_processor_backend
    incremental_streaming_output init_expert_location int8_mamba_ckpt_size is_embedding
    json_model_override_args keep_mm_feature_on_device kt_cpuinfer kt_max_deferred_experts_per_token
    kt_method kt_num_gpu_experts kt_threadpool_count kt_weight_path kv_cache_dtype kv_canary
    kv_canary_real_data kv_canary_sweep_interval kv_events_config language_model_only language_only
    limit_mm_data_per_request linear_attn_backend linear_attn_decode_backend linear_attn_prefill_backend
    linear_attn_verify_backend linear_replayssm_cache_len lmcache_config_file load_balance_method
    load_format load_snapshot_publish_interval log_level log_level_http log_requests log_requests_format
    log_requests_level log_requests_target lora_backend lora_drain_wait_threshold lora_eviction_policy
    lora_paths lora_strict_loading lora_target_modules lora_use_virtual_experts mamba_backend
    mamba_cache_philox_rounds mamba_full_memory_ratio mamba_max_states_per_path mamba_radix_cache_strategy
    mamba_ssm_dtype mamba_track_interval max_ep_size max_loaded_loras max_lora_chunk_size max_lora_rank
    max_loras_per_batch max_mamba_cache_size max_prefill_tokens max_queued_requests max_running_requests
    max_total_tokens media_url_max_file_size_mb mem_fraction_static min_free_slots_delay
    mlx_enable_sampling mm_attention_backend mm_enable_dp_encoder mm_feature_transport
    mm_global_cache_backend mm_io_worker_num mm_preprocess_cache_size_mb mm_process_config
    mm_processor_worker_num model_checksum model_config_parser model_impl model_loader_extra_config
    model_path modelexpress_config modelopt_checkpoint_restore_path modelopt_checkpoint_save_path
    modelopt_export_path modelopt_quant moe_a2a_backend moe_dense_tp_size moe_dp_size moe_runner_backend
    mooncake_ib_device msprobe_dump_config nccl_port nnodes node_rank num_continuous_decode_steps
    num_reserved_decode_tokens numa_node offload_group_size offload_mode offload_num_in_group
    offload_prefetch_step optimistic_prefill_attempts otlp_traces_endpoint page_size pdmux_config_path port
    pp_async_batch_depth pp_max_micro_batch_size pp_size pre_warm_nccl preferred_sampling_params
    prefill_attention_backend prefill_cp_mode prefill_delayer_forward_passes_buckets
    prefill_delayer_max_delay_ms prefill_delayer_max_delay_passes prefill_delayer_queue_min_ratio
    prefill_delayer_token_usage_low_watermark prefill_delayer_wait_seconds_buckets prefill_max_requests
    prefill_only_disable_kv_cache priority_scheduling_preemption_threshold prompt_tokens_buckets
    quantization quantization_param_path quantize_and_serve radix_cache_backend radix_eviction_policy
    random_seed reasoning_parser remote_instance_weight_loader_backend
    remote_instance_weight_loader_seed_instance_ip remote_instance_weight_loader_seed_instance_service_port
    remote_instance_weight_loader_send_weights_group_ports
    remote_instance_weight_loader_start_seed_via_transfer_engine retraction_policy
    return_hidden_states_mode revision rl_on_policy_target rl_quant_profile sampling_backend
    sampling_defaults schedule_conservativeness schedule_low_priority_values_first schedule_policy
    scheduler_recv_interval served_model_name show_time_cost sidecar sidecar_args skip_server_warmup
    skip_tokenizer_init sleep_on_idle sm_group_num smg_grpc_mode smg_http_sidecar_port
    soft_watchdog_timeout spec_trace_dir speculative_accept_threshold_acc
    speculative_accept_threshold_single speculative_adaptive speculative_adaptive_config
    speculative_algorithm speculative_attention_mode speculative_dflash_block_size
    speculative_draft_attention_backend speculative_draft_kv_cache_dtype speculative_draft_load_format
    speculative_draft_model_path speculative_draft_model_quantization speculative_draft_model_revision
    speculative_draft_window_size speculative_dspark_align_verify_tokens_to_graph_tier
    speculative_dspark_block_size speculative_dspark_confidence_sts_path speculative_dspark_sps_table_path
    speculative_eagle_topk speculative_moe_a2a_backend speculative_moe_runner_backend
    speculative_ngram_capacity speculative_ngram_external_corpus_max_tokens
    speculative_ngram_external_corpus_path speculative_ngram_external_sam_budget
    speculative_ngram_match_type speculative_ngram_max_bfs_breadth speculative_ngram_max_trie_depth
    speculative_ngram_min_bfs_breadth speculative_num_draft_tokens speculative_num_steps
    speculative_skip_dp_mlp_sync speculative_token_map speculative_use_rejection_sampling ssl_ca_certs
    ssl_certfile ssl_keyfile ssl_keyfile_password startup_weight_load_mode stat_loggers stream_interval
    stream_response_default_include_usage strip_thinking_cache swa_full_tokens_ratio
    tbo_token_distribution_threshold tokenizer_backend tokenizer_metrics_allowed_custom_labels
    tokenizer_metrics_custom_labels_header tokenizer_mode tokenizer_path tokenizer_worker_num
    tool_call_parser tool_server torch_compile_max_bs tp_size trace_modules triton_attention_num_kv_splits
    triton_attention_reduce_in_fp32 triton_attention_split_tile_size trust_mm_content_hashes
    trust_remote_code use_ray uses_mamba_radix_cache uvicorn_access_log_exclude_prefixes warmups
    watchdog_timeout weight_cache_mode weight_cache_socket weight_cache_timeout weight_loader_disable_mmap
    weight_loader_drop_cache_after_load weight_loader_prefetch_checkpoints
    weight_loader_prefetch_num_threads weight_version
"""
SGLANG_SERVER_ARGS = frozenset(_SERVER_ARG_NAMES.split())
# keys the seeds' settings files use that are no ServerArgs field, and what each means
_NEGATED = {"enable_overlap_schedule": "--disable-overlap-schedule"}
# SGLang's int8 checkpoint pool (#28185) under its own names: the switch picks our format, the size our slots
_INT8_SWITCH = "enable_int8_mamba_checkpoint"
_RENAMED = {"int8_mamba_ckpt_size": "--checkpoint-slots"}
_YAML_SUFFIXES = (".yaml", ".yml")
# SGLang's HiCache settings (server_args.py "Hierarchical cache"): read together by _hicache_argv
_HICACHE_SWITCH = "enable_hierarchical_cache"
_HICACHE_MAPPED = ("hicache_ratio", "hicache_size", "hicache_write_policy", "hicache_storage_backend")
SGLANG_DEFAULT_HICACHE_RATIO = 2.0  # ServerArgs._handle_hicache_ratio_default
_GB_PER_GIB = (1 << 30) / 1e9  # hicache_size is decimal GB (pool_host: host_size * 1e9 // bytes per token)


def load_settings(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The settings object of a launch-settings file: JSON, or YAML (``.yaml``/``.yml``, or a file that is
    not JSON) when PyYAML is importable. Raises :class:`ConfigError` (one line) for a missing or unreadable
    file, a parse error (with its line), YAML without PyYAML, or a root that is no object. O(file size)."""
    target = Path(path)
    if not target.is_file():
        raise ConfigError(
            f"config file not found: {target}" if not target.exists() else f"config {target} is not a file"
        )
    try:
        text = target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config {target}: cannot read it: {err}") from None
    data: Any
    if target.suffix.lower() in _YAML_SUFFIXES:
        data = _yaml(target, text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            try:
                import yaml  # noqa: F401
            except ImportError:
                raise ConfigError(
                    f"config {target}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
                    "YAML needs PyYAML, which is not installed, so give JSON"
                ) from None
            data = _yaml(target, text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config {target}: must hold an object of settings (key: value), got {type(data).__name__}"
        )
    return data


def _yaml(target: Path, text: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise ConfigError(
            f"config {target}: YAML needs PyYAML, which is not installed; give the settings as JSON"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"config {target}: not valid JSON or YAML{line}") from None


def _text(value: Any) -> str | None:
    """A setting's value as a flag's text; None for one that is no single value (a list or object)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return None


def _preset(model_path: str) -> str | None:
    """The model preset the last part of ``model_path`` names (the longest preset name it starts with,
    ignoring case: ``Qwen3-Next-80B-A3B-Instruct`` is ``qwen3-next-80b-a3b``), or None."""
    from mamba_radix.capacity.models import PRESETS

    base = Path(model_path.rstrip("/\\")).name.lower()
    names = [p for p in PRESETS if base == p or base.startswith(p + "-")]
    return max(names, key=len) if names else None


def settings_to_argv(
    settings: dict[str, Any], command: str, source: str = "config"
) -> tuple[list[str], list[str]]:
    """The flags of ``command`` that ``settings`` set, as argv, and the keys ignored (in file order, a
    reason in parentheses where it helps). Raises :class:`ConfigError` for an unknown key (naming the
    closest known one) or a value the flag refuses. O(keys + flags)."""
    from mamba_radix.flags import FLAGS

    table = FLAGS()
    own = {f.flag: f for f in table if command in f.commands and f.where != "launch"}
    every = {f.dest for f in table if f.where != "launch"}
    argv, ignored, handled = _hicache_argv(settings, own, source)
    for raw_key, value in settings.items():
        key = str(raw_key).replace("-", "_")
        if key in handled:
            continue
        flag = _NEGATED.get(key) or "--" + key.replace("_", "-")
        if key == "model_path" and "--model" in own and isinstance(value, str):
            preset = _preset(value)
            if preset is None:
                ignored.append(f"model_path (no model preset is named {Path(value).name!r}; give --model)")
            else:
                argv += ["--model", preset]
            continue
        if key == _INT8_SWITCH and "--checkpoint-format" in own:
            if not isinstance(value, bool):
                raise ConfigError(f"{source}: {raw_key} must be true or false, got {value!r}")
            if value:
                argv += ["--checkpoint-format", "int8"]
            continue
        flag = _RENAMED.get(key, flag)
        if key not in SGLANG_SERVER_ARGS and key not in every and key not in _NEGATED:
            known = sorted(SGLANG_SERVER_ARGS | every | set(_NEGATED))
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(
                f"{source}: unknown setting {raw_key!r} (no SGLang server argument or flag of ours){hint}"
            )
        if value is None:
            ignored.append(f"{key} (null)")
            continue
        if flag not in own:
            ignored.append(key)
            continue
        text = _text(value)
        if text is None:
            raise ConfigError(f"{source}: {raw_key} must be one value, got {type(value).__name__}")
        if key in _NEGATED:
            if not isinstance(value, bool):
                raise ConfigError(f"{source}: {raw_key} must be true or false, got {value!r}")
            text = "false" if value else "true"
        try:
            own[flag].kind(text)
        except (
            Exception
        ) as err:  # the flag type's own message (ArgumentTypeError, or ValueError from str/int)
            raise ConfigError(f"{source}: {raw_key}: {err}") from None
        argv += [flag, text]
    return argv, ignored


def _hicache_argv(
    settings: dict[str, Any], own: dict[str, Any], source: str
) -> tuple[list[str], list[str], set[str]]:
    """The flags SGLang's HiCache keys set for a command whose flags are ``own``, the keys ignored, and
    the keys handled here (the caller skips them). Raises :class:`ConfigError` (one line) for what cannot
    be mapped: ``hicache_size`` where the host pools are sized by a ratio, an L3 storage backend, a
    switch that is no boolean, a value the flag refuses. O(keys)."""
    values = {str(k).replace("-", "_"): (k, v) for k, v in settings.items()}
    keys = [k for k in (_HICACHE_SWITCH, *_HICACHE_MAPPED) if k in values]
    if not keys:
        return [], [], set()
    raw_switch, switch = values.get(_HICACHE_SWITCH, (_HICACHE_SWITCH, False))
    if switch is not None and not isinstance(switch, bool):
        raise ConfigError(f"{source}: {raw_switch} must be true or false, got {switch!r}")
    argv: list[str] = []
    if "--enable-hierarchical-cache" in own and switch:  # plan: it checks what the tier rules out
        argv += ["--enable-hierarchical-cache", "true"]
    if not switch:
        reason = " (no enable_hierarchical_cache: SGLang has no host tier)"
        off = [k + reason for k in keys if k != _HICACHE_SWITCH]
        if _HICACHE_SWITCH in values and "--enable-hierarchical-cache" not in own:
            off.insert(0, _HICACHE_SWITCH)
        return [], off, set(keys)
    ignored: list[str] = []
    storage = values.get("hicache_storage_backend", (None, None))[1]
    if storage is not None:
        raise ConfigError(
            f"{source}: hicache_storage_backend {storage!r} (an L3 tier) is not modelled; drop it to simulate "
            "the host tier alone"
        )
    raw_size, size = values.get("hicache_size", ("hicache_size", 0))
    size = 0 if size is None else size
    if not isinstance(size, (int, float)) or isinstance(size, bool) or size < 0:
        raise ConfigError(f"{source}: {raw_size} must be a number of GB >= 0, got {size!r}")
    if "--host-memory-gb" in own:
        if size > 0:
            argv += ["--host-memory-gb", repr(size / _GB_PER_GIB)]
    elif "--host-memory-ratio" in own:
        if size > 0:
            raise ConfigError(
                f"{source}: {raw_size} ({size} GB) needs the device pools to split, which the simulator sizes "
                "later; give hicache_ratio (host pool / device pool) instead, or see the split with plan "
                "--host-memory-gb"
            )
        ratio = values.get("hicache_ratio", (None, None))[1]
        argv += _checked(
            own, "--host-memory-ratio", SGLANG_DEFAULT_HICACHE_RATIO if ratio is None else ratio, source
        )
    policy = values.get("hicache_write_policy", (None, None))[1]
    if policy is not None and "--host-write-policy" in own:
        argv += _checked(own, "--host-write-policy", policy, source)
    for k in keys:
        flagged = {
            "hicache_ratio": "--host-memory-ratio",
            "hicache_size": "--host-memory-gb",
            "hicache_write_policy": "--host-write-policy",
            _HICACHE_SWITCH: "--enable-hierarchical-cache",
        }.get(k)
        if flagged not in own and k != "hicache_storage_backend":
            ignored.append(k)
    return argv, ignored, set(keys)


def _checked(own: dict[str, Any], flag: str, value: Any, source: str) -> list[str]:
    """``[flag, text]`` for ``value``, checked by the flag's own type (one-line :class:`ConfigError`)."""
    text = _text(value)
    if text is None:
        raise ConfigError(
            f"{source}: {flag[2:].replace('-', '_')} must be one value, got {type(value).__name__}"
        )
    try:
        own[flag].kind(text)
    except Exception as err:  # the flag type's own message
        raise ConfigError(f"{source}: {flag}: {err}") from None
    return [flag, text]


def expand_config(argv: Sequence[str], commands: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` (``COMMAND ... --config FILE ...``) with the file's flags inserted right after the command,
    so that the flags of the command line, parsed later, win; and the ignored keys. ``argv`` unchanged
    (and no keys) when it names no command of ``commands`` or no ``--config``. ``--config`` stays in place
    (the parser knows it). Raises :class:`ConfigError` for two ``--config``, a missing file name, or
    anything :func:`load_settings` / :func:`settings_to_argv` refuse. O(len(argv) + file)."""
    args = list(argv)
    if not args or args[0] not in commands or "--help" in args or "-h" in args:
        return args, []
    paths: list[str] = []
    for i, word in enumerate(args):
        if word == "--config":
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ConfigError("--config needs a file name")
            paths.append(args[i + 1])
        elif word.startswith("--config="):
            paths.append(word.split("=", 1)[1])
    if not paths:
        return args, []
    if len(paths) > 1:
        raise ConfigError(f"--config given {len(paths)} times; give one settings file")
    settings = load_settings(paths[0])
    inserted, ignored = settings_to_argv(settings, args[0], f"config {paths[0]}")
    return [args[0], *inserted, *args[1:]], ignored
