"""The hf backend: plain HF transformers (eager attention), the reference the in-house stack is
checked against and the baseline of ``headscope bench``, with the checks its load makes
(positions the installed transformers builds, tensors missing, extra or misshapen)."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch

from headscope.probes.errors import CheckpointError, HeadscopeError, ModelIncompatibleError
from headscope.probes.models.arch import arch_from_hf_config
from headscope.probes.models.backends.protocol import (
    BackendCommon,
    HeadFn,
    ModelSpec,
    apply_to_heads,
    batch_to,
    check_layers,
    check_quantities,
    module_device,
    spec_from_arch,
)
from headscope.probes.models.backends.resume import ResumableForward
from headscope.probes.models.checkpoints import (
    ModelSource,
    check_safetensors,
    check_tokenizer_vocab,
    check_weight_memory,
    hf_dir,
    load_tokenizer,
    quiet_transformers,
    read_hf_config,
    weight_files,
)
from headscope.probes.models.head_check import input_embeddings
from headscope.probes.models.purpose import lm_head_absent
from headscope.probes.tokens import TokenBatch

__all__ = ["HFReference", "check_device_map", "model_class"]


class HFReference(ResumableForward, BackendCommon):
    """Plain HF transformers model (eager attention, so ``output_attentions`` works), the
    ``"hf"`` backend: patterns from ``output_attentions``, every other quantity and the head
    hooks from PyTorch hooks on the HF modules themselves (:mod:`~headscope.probes.models.hf_layout`
    finds them): ``z`` at the input of the attention output projection, ``out`` at its
    output, ``q``/``k``/``v`` at the projections' outputs (before RoPE and QK-norm),
    ``resid_post`` at each block's output. Any family whose modules it can map runs every
    analysis; it is also the reference the in-house stack is checked against."""

    backend = "hf"
    has_gates = False
    backend_choice = "hf"

    def __init__(
        self,
        hf_model,
        tokenizer,
        spec: ModelSpec,
        *,
        vocab_size: int | None = None,
        trust_remote_code: bool = False,
        hybrid: bool = True,
    ):
        """``hybrid``: where some blocks hold no attention (recurrent or linear-attention layers
        between the attention layers: :func:`~headscope.probes.models.hf_layout.attention_blocks`),
        analyse the attention layers alone (``spec.n_layers`` is their count; ``head_modules`` says
        which blocks they are and which blocks hold none); off for the bridge, which reads every block."""
        from headscope.probes.models.hf_layout import attention_blocks, attention_sublayers, softmax_returned_scores

        self.hf = hf_model.eval()
        if hybrid:  # not for the bridge, which wraps the model as transformers builds it
            unshare_layer_groups(self.hf, spec)
            softmax_returned_scores(self.hf)  # SqueezeBERT returns its scores: the pattern is their softmax
        self.tokenizer = tokenizer
        self._n_blocks = spec.n_layers
        self._attention_blocks = attention_blocks(self.hf, spec, spec.n_layers) if hybrid else None
        if self._attention_blocks is not None:
            spec = dataclasses.replace(spec, n_layers=len(self._attention_blocks))
        self._sublayers = attention_sublayers(self.hf, spec.n_layers) if hybrid and not self._attention_blocks else None
        if self._sublayers is not None:  # several attention modules per block (LongCat-Flash): each a layer
            spec = dataclasses.replace(spec, n_layers=len(self._sublayers[1]))
        self.spec = spec
        self.vocab_size = vocab_size
        self.trust_remote_code = trust_remote_code
        self._layout = None

    @property
    def layout(self):
        """The model's :class:`~headscope.probes.models.hf_layout.HFLayout` (found on first use)."""
        if self._layout is None:
            from headscope.probes.models.hf_layout import find_layout

            self._layout = find_layout(
                self.hf, self.spec, layers=self._attention_blocks, n_blocks=self._n_blocks, sublayers=self._sublayers
            )
        return self._layout

    @property
    def head_modules(self) -> dict:
        """run.json's ``head_modules``: the attention output projection the head hooks use (its
        path with ``{layer}``), how it was found (``"name"`` or ``"shape"``) and checked; where it
        cannot be found, ``attn_out`` None and why not."""
        try:
            return self.layout.record()
        except ModelIncompatibleError as e:
            return {"attn_out": None, "found_by": None, "check": str(e).strip().splitlines()[0]}

    @classmethod
    def from_source(
        cls,
        source: ModelSource,
        *,
        attn_implementation: str = "eager",
        for_bridge: bool = False,
        trust_remote_code: bool = False,
        dtype: torch.dtype = torch.float32,
        device_map: str | None = None,
        max_memory: dict | None = None,
    ):
        """``dtype``: the weights' dtype (HF keeps softmax in fp32 and norms in the weights'
        dtype); ``device_map="auto"`` spreads the layers over every visible GPU through
        accelerate (:func:`check_device_map` says when it cannot), each GPU ``i`` holding at most
        ``max_memory[i]`` bytes where given (:mod:`~headscope.probes.models.placement` plans it)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        if device_map is not None:
            check_device_map(device_map)
        elif max_memory is not None:
            raise ValueError("max_memory goes with device_map='auto' (it bounds what each device holds)")

        directory = hf_dir(source)
        hf_cfg = read_hf_config(source)
        arch = arch_from_hf_config(hf_cfg, str(directory / "config.json"))
        check_weight_memory(hf_cfg, directory / "config.json")
        tokenizer = load_tokenizer(directory, trust_remote_code=trust_remote_code)
        if arch.vocab_size is not None:
            check_tokenizer_vocab(tokenizer, arch.vocab_size, directory)
        files = weight_files(directory)
        for f in files:
            if f.suffix == ".safetensors":
                check_safetensors(f)
        where = files[0] if len(files) == 1 else directory
        klass, encoder_only, its_encoder = model_class(hf_cfg, arch, directory, for_bridge=for_bridge)
        torch.manual_seed(0)  # heads missing from the checkpoint (BERT MLM head) initialise the same every time
        try:
            with quiet_transformers():
                config = AutoConfig.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
                config._attn_implementation = attn_implementation
                if encoder_only:  # its encoder alone (T5GemmaEncoderModel refuses an encoder-decoder's config)
                    config.is_encoder_decoder = False
                model, info = klass.from_pretrained(
                    str(directory),
                    config=config,
                    dtype=dtype,
                    trust_remote_code=trust_remote_code,
                    output_loading_info=True,
                    ignore_mismatched_sizes=True,
                    **({"device_map": device_map} if device_map is not None else {}),
                    **({"max_memory": dict(max_memory)} if max_memory is not None else {}),
                )
        except (HeadscopeError, ImportError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - unreadable weights: corrupt, truncated, refused pickle
            detail = str(e).strip().splitlines()[0].split(". ")[0][:160] if str(e).strip() else ""
            raise CheckpointError(
                f"{where}: refused or unreadable ({type(e).__name__}: {detail}); only intact safetensors or "
                "weights-only torch files are loaded"
            ) from None
        _check_positions_built(model, directory / "config.json")
        _check_loading_info(model, info, where, strict_head=klass is AutoModelForCausalLM)
        spec = spec_from_arch(arch, source.name, "hf")
        vocab = getattr(model.config, "vocab_size", None) or arch.vocab_size  # CANINE's config has none
        if its_encoder:  # BART and its kin: the encoder alone runs; the decoder is freed
            model = model.get_encoder()
        if encoder_only or its_encoder:  # the encoder's self-attention heads, bidirectional
            spec = dataclasses.replace(spec, causal=False)
        return cls(
            model,
            tokenizer,
            spec,
            vocab_size=vocab,
            trust_remote_code=trust_remote_code,
            hybrid=not for_bridge,
        )

    @property
    def device(self) -> torch.device:
        return module_device(self.hf)

    @property
    def network(self) -> torch.nn.Module:
        """The HF model that runs."""
        return self.hf

    def check_head_hooks(self) -> None:
        """The head hooks need each layer's attention output projection:
        :class:`~headscope.probes.errors.ModelIncompatibleError` naming the bridge where they cannot be found."""
        self.layout  # noqa: B018 - finds the heads' modules, or says why not

    @property
    def input_device(self) -> torch.device:
        """Where token ids go: the embedding's device (the first GPU of a ``device_map``)."""
        emb = input_embeddings(self.hf)
        return emb.weight.device if emb is not None else self.device

    def to(self, device) -> HFReference:
        self.hf.to(device)
        return self

    def _call(self, input_ids, attention_mask, **kw):
        """A causal LM's full model (logits); an encoder's base model (last hidden states,
        also when the object holds an MLM or classification head)."""
        self._n_pos = input_ids.shape[1]  # the head hooks' positions (Longformer pads its hidden states past them)
        if self.spec.causal:
            res = self.hf(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kw)
            return res, res.logits if "logits" in res else res.last_hidden_state
        res = getattr(self.hf, "base_model", self.hf)(input_ids=input_ids, attention_mask=attention_mask, **kw)
        return res, res.last_hidden_state

    # resuming (:class:`~headscope.probes.models.backends.resume.ResumableForward`): HF's own layer loop
    def _place(self, input_ids, attention_mask):
        device = self.input_device
        return input_ids.to(device), attention_mask.to(device)

    def _whole(self, ids, am) -> torch.Tensor:
        """Logits (a causal LM) or last hidden states (an encoder)."""
        return self._call(ids, am)[1]

    def _resume_blocks(self):
        return self.layout.all_blocks or self.layout.blocks

    def forward(self, input_ids, attention_mask, *, stop_at_layer=None, start_at_layer=None, resid=None):
        """As :meth:`ResumableForward.forward`; a hybrid model's layer ``l`` (its ``l``-th attention
        layer) stops and resumes at that layer's block, the blocks between run as they are."""
        layers = self._attention_blocks
        if layers is not None:
            n = self.spec.n_layers
            to_block = lambda l: None if l is None else (layers[l] if l < n else self._n_blocks)  # noqa: E731
            stop_at_layer, start_at_layer = to_block(stop_at_layer), to_block(start_at_layer)
        return super().forward(
            input_ids, attention_mask, stop_at_layer=stop_at_layer, start_at_layer=start_at_layer, resid=resid
        )

    def _output_embedding(self):
        return self.hf.get_output_embeddings()

    @contextmanager
    def head_hooks(self, fns: dict[int, HeadFn]):
        """``fn(z)`` through a forward pre-hook on each listed layer's attention output projection."""
        n_heads = self.spec.n_heads
        handles = []

        part = self.layout.heads  # the heads' features first, another mixer's after (ConvBERT); None: all
        turn = self.layout.turn  # the axes turned from [batch, position, features] (FSMT, SqueezeBERT)
        pads = self._window is not None  # Longformer pads its hidden states to a multiple of its window

        def pre(module, args, fn):
            x = args[0].transpose(*turn) if turn else args[0]
            n = (getattr(self, "_n_pos", None) if pads else None) or x.shape[1]  # Longformer's padding: past the input
            x, past = x[:, :n], x[:, n:]
            if part is not None:
                x = torch.cat([apply_to_heads(fn, x[..., :part].contiguous(), n_heads), x[..., part:]], dim=-1)
            else:
                x = apply_to_heads(fn, x.contiguous(), n_heads)
            x = torch.cat([x, past], dim=1) if past.shape[1] else x
            return (x.transpose(*turn).contiguous() if turn else x, *args[1:])

        try:
            for l, fn in fns.items():
                handles.append(self.layout.attn_out[l].register_forward_pre_hook(lambda m, a, fn=fn: pre(m, a, fn)))
            yield
        finally:
            for h in handles:
                h.remove()

    def run(self, batch: TokenBatch, quantities=("pattern",), layers=None) -> dict:
        qs = check_quantities(quantities)
        ls = check_layers(layers, self.spec.n_layers)
        bad = [q for q in qs if q in ("scores", "q_rot", "k_rot")]
        if bad:
            raise ValueError(f"quantity {bad[0]!r} is inside HF's attention function; use --backend inhouse")
        from headscope.probes.models.hf_layout import is_attention

        if "resid_post" in qs and all(is_attention(b) for b in self.layout.blocks):
            raise ValueError(f"{self.spec.name!r} has no block module (its layers are parallel lists): no resid_post")
        if "resid_post" in qs and self.layout.sublayers:
            raise ValueError(f"{self.spec.name!r} runs several attention layers per block: no resid_post per layer")
        out: dict = {}
        handles = []
        spec = self.spec

        def heads(t, n):  # [batch, pos, n × d_head] -> [batch, n, pos, d_head]
            return t.reshape(t.shape[0], t.shape[1], n, -1).transpose(1, 2)

        part = self.layout.heads if "z" in qs else None  # the heads' features of z's input (ConvBERT); None: all
        bm = self._reader(qs, batch)  # a hooked tensor as [batch, position, …] at the input's positions

        try:
            for l in ls:
                if "z" in qs:
                    handles.append(
                        self.layout.attn_out[l].register_forward_pre_hook(
                            lambda m, a, l=l: out.__setitem__(
                                ("z", l), heads(bm(a[0][..., :part]).detach(), spec.n_heads)
                            )
                        )
                    )
                if "out" in qs:
                    handles.append(
                        self.layout.attn_out[l].register_forward_hook(
                            lambda m, a, o, l=l: out.__setitem__(  # I-BERT's QuantLinear: (output, scale)
                                ("out", l), bm(o[0] if isinstance(o, tuple) else o).detach()
                            )
                        )
                    )
                if "resid_post" in qs:
                    handles.append(
                        self.layout.blocks[l].register_forward_hook(
                            lambda m, a, o, l=l: out.__setitem__(("resid_post", l), bm(_hidden(o)).detach())
                        )
                    )
                for q in ("q", "k", "v"):
                    if q not in qs:
                        continue
                    mods = getattr(self.layout, q)
                    if mods is None:
                        raise ValueError(
                            f"{spec.name!r} fuses its Q/K/V projections; quantity {q!r} needs --backend inhouse or bridge"
                        )
                    n = spec.n_heads if q == "q" else spec.n_kv_heads
                    handles.append(
                        mods[l].register_forward_hook(
                            lambda m, a, o, l=l, q=q, n=n: out.__setitem__((q, l), heads(bm(o).detach(), n))
                        )
                    )
            batch = batch_to(batch, self.input_device)
            with torch.inference_mode():
                res, output = self._call(batch.input_ids, batch.attention_mask, output_attentions="pattern" in qs)
        finally:
            for h in handles:
                h.remove()
        if "pattern" in qs:
            attentions = self._patterns(res.attentions, batch)
            out.update({("pattern", l): attentions[l] for l in ls})
        out[("output", None)] = output
        if self.spread:  # a device map: every tensor to the inputs' device, where the reducers work
            device = self.input_device
            out = {k: v.to(device) for k, v in out.items()}
        return out

    @property
    def _window(self):
        """The config's ``attention_window`` (Longformer: sliding-window attention, hidden states padded to
        a multiple of it), None where it has none."""
        return getattr(getattr(self.hf, "config", None), "attention_window", None)

    def _reader(self, qs, batch):
        """``t -> t`` as ``[batch, position, …]`` at the input's positions: turned back where the layers hold
        another order (FSMT's time-major, SqueezeBERT's channels first), cut where they pad (Longformer)."""
        hooked = any(q in qs for q in ("z", "out", "resid_post", "q", "k", "v"))
        turn = self.layout.turn if hooked else None
        n_pos = batch.input_ids.shape[1] if self._window is not None else None
        return (lambda t: t.transpose(*turn)[:, :n_pos]) if turn else (lambda t: t[:, :n_pos])

    def _patterns(self, attentions, batch) -> tuple:
        """HF's ``attentions`` as one ``[batch, head, pos, pos]`` pattern per layer analysed (a hybrid's
        attention blocks', sliding-window scores laid out as ``[query, key]``), or
        :class:`ModelIncompatibleError` saying what HF gives instead (:func:`~headscope.probes.models.unsupported.check_patterns`)."""
        from headscope.probes.models.hf_layout import attention_of_layers, unbanded
        from headscope.probes.models.unsupported import check_patterns

        attentions = attention_of_layers(attentions, self._attention_blocks, self._n_blocks)
        return check_patterns(unbanded(attentions, self._window), self.spec, *batch.input_ids.shape)

    @property
    def spread(self) -> bool:
        """Whether a device map spreads the model over several devices."""
        device_map = getattr(self.hf, "hf_device_map", None) or {}
        return len({str(d) for d in device_map.values()}) > 1


def _hidden(output) -> torch.Tensor:
    """A block's hidden states: its output, the first of a tuple, or the first tensor of a dict
    (SqueezeBERT's ``{"feature_map": …}``)."""
    if isinstance(output, dict):
        return next(v for v in output.values() if torch.is_tensor(v))
    return output[0] if isinstance(output, tuple) else output


def unshare_layer_groups(model, spec) -> None:
    """ALBERT shares one layer (``albert_layer_groups``: ``num_hidden_groups`` groups, 1 in every released
    checkpoint) across its ``num_hidden_layers`` layers: no list holds a module per layer, so no hook can
    tell one layer's heads from another's. Each group's list entry becomes one entry per layer (copies of
    the group's modules holding the same parameters and buffers: no weight is copied) and the encoder's
    own config says as many groups, so its loop calls entry ``i`` at layer ``i``: the same computation, a
    module per layer. A group of several layers (``inner_group_num`` > 1) runs more attention layers
    than the config counts: :class:`ModelIncompatibleError`, saying so."""
    import copy

    for module in model.modules():
        groups, config = getattr(module, "albert_layer_groups", None), getattr(module, "config", None)
        if groups is None or config is None or len(groups) == config.num_hidden_layers:
            continue
        inner = getattr(config, "inner_group_num", 1)
        if inner != 1:
            raise ModelIncompatibleError(
                f"{spec.name!r} ({spec.family}): inner_group_num={inner}: each of its {config.num_hidden_layers} "
                f"layers runs {inner} shared attention layers, {config.num_hidden_layers * inner} in all; headscope "
                "reads one attention layer per layer (inner_group_num=1, as every released ALBERT)"
            )
        n, g = config.num_hidden_layers, config.num_hidden_groups
        shared = {id(t): t for t in (*module.parameters(), *module.buffers())}
        module.albert_layer_groups = torch.nn.ModuleList(
            copy.deepcopy(groups[int(i / (n / g))], memo={**shared, id(config): config}) for i in range(n)
        )
        module.config = copy.copy(config)  # the encoder's own: the model's config keeps its groups
        module.config.num_hidden_groups = n


def model_class(hf_cfg: dict, arch, directory, *, for_bridge: bool = False) -> tuple[type, bool, bool]:
    """``(auto class, encoder_only, its_encoder)`` :meth:`HFReference.from_source` loads a checkpoint
    with (``its_encoder``: a seq2seq model loaded whole, its encoder kept)."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    encoder_only = _encoder_only(hf_cfg)
    its_encoder = not (encoder_only or for_bridge) and _seq2seq(hf_cfg)  # load it whole, keep its encoder
    if encoder_only:
        from transformers import AutoModelForTextEncoding as klass
    elif arch.encoder or its_encoder:
        klass = AutoModelForMaskedLM if for_bridge else AutoModel
    elif not for_bridge and lm_head_absent(directory, arch):  # a decoder saved without its LM head (#47)
        klass = AutoModel  # its base model: forward returns the last hidden states, not random logits
    else:
        klass = AutoModelForCausalLM
    return klass, encoder_only, its_encoder


def _encoder_only(hf_cfg: dict) -> bool:
    """Whether an encoder–decoder checkpoint (``is_encoder_decoder``) of a type transformers has an
    encoder-only class for (T5, mT5, UMT5: ``T5EncoderModel``), or its encoder saved alone, is loaded
    as its encoder alone: its self-attention heads are the ones analysed, the decoder (its self- and
    cross-attention) is not loaded. Other encoder–decoders load as the config reader says (BART:
    its decoder, ``BartForCausalLM``, whose cross-attention has no encoder to read and is skipped)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES as ENCODERS

    mtype = hf_cfg.get("model_type")
    if mtype not in ENCODERS or not ENCODERS[mtype].endswith("EncoderModel"):
        return False
    return bool(hf_cfg.get("is_encoder_decoder")) or ENCODERS[mtype] in (hf_cfg.get("architectures") or ())


def _seq2seq(hf_cfg: dict) -> bool:
    """Whether the checkpoint is an encoder–decoder text model (``is_encoder_decoder``, a type of
    transformers' sequence-to-sequence mapping: BART, mBART, Marian, Pegasus, …) with no encoder-only
    class: the hf backend loads it whole and keeps its encoder (``get_encoder()``), whose
    self-attention heads are analysed; the decoder and its cross-attention are not."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES as SEQ2SEQ

    return bool(hf_cfg.get("is_encoder_decoder")) and hf_cfg.get("model_type") in SEQ2SEQ


_IGNORED_SUFFIXES = ("position_ids", "rotary_emb.inv_freq", "attn.masked_bias", "attn.bias")


def _check_positions_built(model, config_path) -> None:
    """Refuse a config whose ``position_embedding_type`` the installed transformers' model
    class does not implement: transformers 5 dropped BERT-style ``relative_key`` /
    ``relative_key_query`` and builds absolute positions instead, silently, so every pattern
    and figure would belong to another model than the checkpoint's."""
    import inspect
    import sys

    import transformers

    kind = getattr(model.config, "position_embedding_type", None)
    if kind in (None, "absolute"):
        return
    module = sys.modules.get(type(model).__module__)
    try:
        implemented = module is not None and "position_embedding_type" in inspect.getsource(module)
    except (OSError, TypeError):  # no source to read (compiled, remote code): trust the class
        implemented = True
    if not implemented:
        raise ModelIncompatibleError(
            f"{config_path}: position_embedding_type={kind!r} is not implemented by transformers "
            f"{transformers.__version__}'s {model.config.model_type} (it builds absolute positions instead, "
            "which is another model than this checkpoint); no headscope backend computes it"
        )


def _check_loading_info(model, info: dict, where, *, strict_head: bool) -> None:
    """Refuse an HF model whose checkpoint lacks tensors of the base model (e.g. a config
    with more layers than the weights), holds tensors the base model would have used
    (fewer layers), or holds a tensor of another shape. A task head absent from the
    checkpoint (BERT's MLM head, seeded) is allowed unless ``strict_head`` (a causal LM:
    its logits would be random)."""
    prefix = model.base_model_prefix
    base = model.base_model
    in_base = (lambda k: True) if base is model else (lambda k: k.startswith(prefix + "."))
    missing = sorted(
        k for k in info.get("missing_keys", ()) if (strict_head or in_base(k)) and not k.endswith(_IGNORED_SUFFIXES)
    )
    base_children = {n for n, _ in base.named_children()}
    unexpected = sorted(
        k
        for k in info.get("unexpected_keys", ())
        if k.removeprefix(prefix + ".").split(".")[0] in base_children and not k.endswith(_IGNORED_SUFFIXES)
    )
    mismatched = sorted(info.get("mismatched_keys", ()), key=lambda m: str(m[0]))
    layers = getattr(model.config, "num_hidden_layers", None)
    hint = f"; does config.json (num_hidden_layers={layers}) describe these weights?"
    if missing:
        raise CheckpointError(f"{where}: tensor {missing[0]!r} missing from checkpoint ({len(missing)} missing){hint}")
    if unexpected:
        raise CheckpointError(
            f"{where}: unexpected tensor {unexpected[0]!r} in checkpoint ({len(unexpected)} extra){hint}"
        )
    if mismatched:
        key, got, want = mismatched[0][0], mismatched[0][1], mismatched[0][2]
        raise CheckpointError(
            f"{where}: tensor {key!r} has shape {tuple(got)}; the config implies {tuple(want)} "
            f"({len(mismatched)} mismatched)"
        )


def check_device_map(device_map) -> None:
    """``device_map`` must be ``"auto"`` and accelerate installed; a one-line ``ValueError``
    or ``ImportError`` naming the package otherwise (accelerate is not a dependency)."""
    if device_map != "auto":
        raise ValueError(f"device_map must be 'auto'; got {device_map!r}")
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise ImportError(
            "device_map='auto' needs the accelerate package, which is not installed: pip install accelerate"
        ) from None
