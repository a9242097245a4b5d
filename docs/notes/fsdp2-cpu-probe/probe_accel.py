"""Step 2b: the same through accelerate.Accelerator (what transformers.Trainer uses): which distributed type does
accelerate pick on CPU with the FSDP env from `accelerate launch --use_fsdp --fsdp_version 2`?"""
import hashlib, os, sys, time
import torch, torch.distributed as dist
from torch.distributed.tensor import DTensor
from accelerate import Accelerator
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model

MODEL = "/opt/grpo-deploy/models/tiny-qwen2"
env = {k: v for k, v in os.environ.items() if k.startswith(("ACCELERATE_", "FSDP_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
force = os.environ.get("PROBE_FORCE_FSDP") == "1"
acc = Accelerator()
st = acc.state
if force:
    # accelerate 1.15 only honours the FSDP plugin on GPU-like distributed types; on CPU it stays MULTI_CPU (DDP).
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    if st.distributed_type == DistributedType.MULTI_CPU:
        from accelerate.state import PartialState
        # AcceleratorState() re-copies PartialState's shared dict on every construction, so patch both.
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        st.distributed_type = DistributedType.FSDP
        st.fsdp_plugin = FullyShardedDataParallelPlugin()
def p(*a): print(f"[rank{acc.process_index}]", *a, flush=True)
p("env", env) if acc.is_main_process else None
p("distributed_type", st.distributed_type, "backend", st.backend, "num_processes", acc.num_processes, "device", acc.device,
  "fsdp_plugin", None if getattr(st, "fsdp_plugin", None) is None else (st.fsdp_plugin.fsdp_version, str(st.fsdp_plugin.state_dict_type), st.fsdp_plugin.reshard_after_forward, str(st.fsdp_plugin.auto_wrap_policy)), "is_fsdp2", acc.is_fsdp2)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0))
opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-2)
model, opt = acc.prepare(model, opt)
p("prepared model type", type(model).__name__, type(model).__mro__[1].__name__)
lora = [(n, q) for n, q in model.named_parameters() if "lora_" in n]
p("lora param type", type(lora[0][1]).__name__, tuple(lora[0][1].shape))
ids = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(acc.process_index))
out = model(input_ids=ids, labels=ids)
acc.backward(out.loss); opt.step(); opt.zero_grad()
p(f"step ok loss={out.loss.item():.4f}")
p("before save: distributed_type", acc.distributed_type, "n models", len(acc._models))
acc.save_state("/work/ckpt_accel")
p("save_state ok", sorted(os.listdir("/work/ckpt_accel")))
h = hashlib.sha256()
unwrapped = acc.unwrap_model(model)
sd = {k: v for k, v in unwrapped.state_dict().items() if "lora_" in k}
for k in sorted(sd):
    v = sd[k]
    full = v.full_tensor() if isinstance(v, DTensor) else v
    h.update(k.encode()); h.update(full.detach().cpu().contiguous().numpy().tobytes())
digests = acc.gather_for_metrics([h.hexdigest()]) if False else None
objs = [None] * acc.num_processes
dist.all_gather_object(objs, h.hexdigest()) if acc.num_processes > 1 else None
p("lora digest", h.hexdigest()[:16], "agree", len(set(objs)) == 1 if acc.num_processes > 1 else "n/a")
acc.wait_for_everyone()
p("DONE")
