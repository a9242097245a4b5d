"""Step 3: TRL 1.16 AsyncGRPOTrainer, LoRA, 2 processes, FSDP2 on CPU (accelerate patched), stub rollout worker,
fake vLLM for the LoRA-sync path (pause / adapter save collective / load_lora_adapter / resume)."""
import os, queue, threading, time, hashlib
import numpy as np, torch

def patch_accelerate_fsdp_on_cpu():
    """accelerate 1.15 honours FSDP only on GPU-like distributed types; on CPU it stays MULTI_CPU (DDP)."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType
    orig = AcceleratorState.__init__
    def init(self, *a, fsdp_plugin=None, **kw):
        orig(self, *a, fsdp_plugin=fsdp_plugin, **kw)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
    AcceleratorState.__init__ = init
if os.environ.get("PROBE_PATCH", "1") == "1":
    patch_accelerate_fsdp_on_cpu()

from grpo_deploy.runtime import trl_hooks, attention_shim; trl_hooks.neutralise_peak_flops()  # torch.cuda.get_device_name on CPU otherwise
print("attention shim:", attention_shim.install("on"), flush=True)  # FA3 kernel is CUDA-only/offline
from datasets import Dataset
from peft import LoraConfig
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

class StubWorker:
    def __init__(self):
        self.rollout_buffer, self.metrics_queue, self.version, self.stop_ev = queue.Queue(maxsize=64), queue.Queue(), 0, threading.Event()
    def start(self):
        def fill():
            g, rng = 0, np.random.default_rng(0)
            while not self.stop_ev.is_set():
                adv = rng.standard_normal(4); adv = (adv - adv.mean()) / (adv.std() + 1e-6)
                for a in adv:
                    ids = rng.integers(3, 100, 24)
                    mask = np.r_[np.zeros(8, np.int64), np.ones(16, np.int64)]
                    s = RolloutSample(prompt=[], completion=[], input_ids=ids, completion_mask=mask,
                                      old_log_probs=np.full(24, -np.log(100), np.float32), advantage=float(a),
                                      model_version=self.version, group_id=g, metrics={})
                    while not self.stop_ev.is_set():
                        try: self.rollout_buffer.put(s, timeout=0.5); break
                        except queue.Full: pass
                g += 1
        threading.Thread(target=fill, daemon=True).start()
    def stop(self): self.stop_ev.set()
    def update_model_version(self, v): self.version = v
    def check_health(self, stale_after_s): pass

rank = int(os.environ.get("RANK", "0"))
args = AsyncGRPOConfig(output_dir="/work/out_trl", use_cpu=True, max_steps=3, per_device_train_batch_size=2,
                       gradient_accumulation_steps=1, num_generations=4, max_completion_length=16, learning_rate=1e-3,
                       logging_steps=1, save_steps=3, save_strategy="steps", report_to="none", token_budget=0,
                       vllm_server_base_url=os.environ["PROBE_URL"], weight_sync_steps=1, max_staleness=4, bf16=False)
trainer = AsyncGRPOTrainer(model="/opt/grpo-deploy/models/tiny-qwen2", reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
                           args=args, train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "hi"}]] * 8}),
                           peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
                           rollout_worker=StubWorker() if rank == 0 else None)
acc = trainer.accelerator
print(f"[rank{acc.process_index}] distributed_type={acc.distributed_type} backend={acc.state.backend} n={acc.num_processes} "
      f"is_fsdp2={acc.is_fsdp2} trainer.is_fsdp_enabled={trainer.is_fsdp_enabled} lora_sync={trainer._lora_sync} "
      f"split/dispatch={acc.split_batches}/{acc.dispatch_batches}", flush=True)
trainer.train()
m = acc.unwrap_model(trainer.model)
print(f"[rank{acc.process_index}] TRAINED steps={trainer.state.global_step} model={type(trainer.model).__name__} "
      f"lora_param={type(next(p for n, p in m.named_parameters() if 'lora_' in n)).__name__}", flush=True)
