#include "app/trainer.h"
#include "app/train_defaults.h"
#include "app/training_run.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/divergence.h"
#include "app/rank_report.h"
#include "app/spike_detector.h"
#include "app/stop_request.h"
#include "app/report.h"
#include "app/run_checkpoints.h"
#include "backend/make_backend.h"
#include "backend/quant_format.h"
#include "comm/communicator.h"
#include "comm/device_communicator.h"
#include "comm/groups.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/file_digest.h"
#include "core/json_num.h"
#include "core/paths.h"
#include "core/units.h"
#include "data/data_loader.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "infer/generate.h"
#include "memory/budget.h"
#include "memory/step_memory.h"
#include "model/gptq_folder.h"
#include "model/hf_weights.h"
#include "model/sparsity.h"
#include "model/tensor_parallel.h"
#include "plan/fit.h"
#include "report/chrome_trace.h"
#include "report/html_report.h"
#include "report/memory_report.h"
#include "report/progress.h"
#include "run/compat.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/replan.h"
#include "train/schedule.h"

namespace memfit {

namespace fs = std::filesystem;

// The world: ranks, the parallel layout and its process groups; what combines and the batch,
// checked before any work. Data parallel (`mpirun -np N memfit train ...`): every rank runs its
// --micro-batch sequences; rank 0 alone prints and writes outputs. Tensor parallel (--tp T):
// groups of T consecutive ranks share each micro-batch; pipeline parallel (--pp P): P stages;
// data parallel runs over the N / (T P) copies of the model.
TrainingRun::TrainingRun(const TrainOptions & given)
    : opt_(given), progress_(ProgressMode::quiet), budget_file_(given.budget_file) {
    if (given.steps < 0) throw ConfigError(fmt::format("--steps {}: must be at least 1", given.steps));
    fill_lr(opt_);   // the steps follow in resolve(), once the loader knows an epoch's rows
    const TrainOptions & opt = opt_;
    // Decoupled decay scales the weights by 1 - lr x wd each step: at 1 or more they flip sign and
    // grow, and the divergence that follows would be blamed on the learning rate.
    if (double(opt.lr) * double(opt.weight_decay) >= 1.0)
        throw ConfigError(fmt::format("--weight-decay {:g} with --lr {:g}: each update would scale the weights by 1 - "
                                      "lr x decay = {:g}, flipping their sign; weight decay is usually 0 to 0.1",
                                      opt.weight_decay, opt.lr, 1.0 - double(opt.lr) * double(opt.weight_decay)));
    const ProgressMode mode = progress_mode(opt.progress);
    set_comm_timeout(opt.comm_timeout);
    comm_ = make_communicator();
    world_ = comm_->size();
    lead_ = comm_->rank() == 0;
    check_ranks_agree(*comm_, opt);
    // What combines (run/compat.h), before any work: the numbers, the world's layout, the rest.
    if (auto why = out_of_range(opt)) throw ConfigError(*why);
    layout_ = derive_layout(world_, opt.layout.tp, opt.layout.pp);
    layout_.cp = cp_ = opt.layout.cp;
    if (cp_ > 1 && layout_.dp % cp_ != 0)
        throw ConfigError(fmt::format("{} rank{} cannot be laid out as --tp {} x --cp {} x --pp {}: the world size must "
                                      "be a multiple of {}", world_, world_ == 1 ? "" : "s", layout_.tp, cp_, layout_.pp,
                                      layout_.tp * cp_ * layout_.pp));
    if (opt.layout.ep > 1 && layout_.dp % opt.layout.ep != 0)
        throw ConfigError(fmt::format("--ep {}: {} rank{} cannot form expert groups of {}: run a multiple of {} (mpirun "
                                      "-np {} ...)", opt.layout.ep, world_, world_ == 1 ? "" : "s", opt.layout.ep,
                                      opt.layout.ep, opt.layout.ep));
    cfg_ = run_model(opt);   // read once: load() completes it (vocabulary, trained context)
    check_supported(opt, cfg_, nullptr);
    if (layout_.tp > 1 || layout_.pp > 1 || cp_ > 1) groups_ = std::make_unique<ProcessGroups>(*comm_, layout_);
    ranks_ = layout_.dp / cp_;
    rank_ = (groups_ ? groups_->coords.dp : comm_->rank()) / cp_;
    cp_rank_ = groups_ ? groups_->coords.dp % cp_ : 0;
    data_comm_ = groups_ ? groups_->dp.get() : comm_.get();
    // The batch: --micro-batch is per data-parallel rank; the loader reads the global batch.
    run_ = opt;
    run_.layout.dp = ranks_;
    resolve_batch(run_, ranks_);
    if (run_.optimizer_in_backward && run_.grad_accum > 1)
        throw ConfigError(fmt::format("--optimizer-in-backward with a global batch of {} on {} rank(s) of {} sequences "
                                      "takes {} micro-batches per step, and each would update the weights; set "
                                      "--global-batch to micro-batch x ranks",
                                      run_.global_batch, ranks_, run_.micro_batch, run_.grad_accum));
    if (run_.optimizer_in_backward && opt.skip_spikes > 0)
        throw ConfigError("--optimizer-in-backward with --skip-spikes: the layers are updated before the step's loss "
                          "and gradient norm are known, so a spike cannot be left out; drop --skip-spikes");
    if (world_ > 1 && !opt.budget_file.empty())
        throw ConfigError(fmt::format("--budget-file re-plans one process's run mid-training; it is not supported with "
                                      "{} ranks: set --memory-budget (per rank) instead", world_));
    progress_ = Progress(lead_ ? mode : ProgressMode::quiet);
    if (opt.threads > 0) omp_set_num_threads(opt.threads);
    install_stop_handlers(parse_stop_signals(opt.stop_signals));
    spikes_ = SpikeDetector(opt.skip_spikes);
    // Tests only: "STEP:FACTOR,..." multiplies those steps' loss gradients (a spike; nan: NaN);
    // "STEP:batch" spoils data-parallel rank 0's rows of that step's batch (spoil_rows: a loss spike).
    if (const char * v = std::getenv("MEMFIT_TEST_GRAD_SPIKES")) {
        std::string list = v;
        for (size_t at = 0; at < list.size();) {
            const size_t end = std::min(list.find(',', at), list.size());
            const std::string item = list.substr(at, end - at), what = item.substr(item.find(':') + 1);
            if (what == "batch") bad_batches_.insert(std::atoi(item.c_str()));
            else injected_[std::atoi(item.c_str())] = std::strtof(what.c_str(), nullptr);
            at = end + 1;
        }
    }
    // --resume auto: the newest complete checkpoint of the folder, or a fresh start, so that a
    // scheduler can rerun the same command line after a preemption.
    resume_ = opt.resume;
    if (opt.resume == "auto") {
        resume_ = newest_checkpoint(checkpoint_root());
        check_complete();
    }
}

// --resume auto found a checkpoint at or past the last step (known once --epochs has its steps).
void TrainingRun::check_complete() {
    if (opt_.resume != "auto" || resume_.empty() || opt_.steps == 0) return;
    const int at = json_get_in<int>(load_checkpoint_meta(resume_), "step", resume_, 1, (1 << 30));
    complete_ = at >= opt_.steps;
    if (complete_ && lead_)
        std::printf("--resume auto: %s is at step %d of --steps %d: the run is complete\n", resume_.c_str(), at,
                    opt_.steps);
}

// Everything but the status line goes through the progress display, so a terminal's live line
// stays intact, --json keeps stdout JSON Lines and --quiet keeps it empty.
// A warning reaches the log whatever --progress says (quiet leaves out status lines, not this).
void TrainingRun::warn(const std::string & text) {
    if (progress_.mode() != ProgressMode::quiet) say("warning: " + text);
    else if (lead_) std::fprintf(stderr, "memfit: warning: %s\n", text.c_str());
}

void TrainingRun::say(const std::string & text) {
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        progress_.message(text.substr(start, end - start));
        start = end + 1;
    }
}

void TrainingRun::load() {
    // The positions this run trains (checkpoints and exports record them; generation stays
    // inside): a fresh model's are --seq's, a pre-trained folder's what it records plus --seq's
    // (a folder that records none, from the Hub, was trained on all of them).
    if (!has_hf_weights(opt_.model)) cfg_.trained_seq = opt_.seq;
    else if (cfg_.trained_seq > 0) cfg_.trained_seq = std::max(cfg_.trained_seq, opt_.seq);
    // --device cuda, before any work (no device: one error line): each rank takes the GPU of its
    // local rank; gradients go over NCCL.
    const char * local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    backend_ = make_backend(opt_.device, local_rank ? std::atoi(local_rank) : 0);
    check_supported(opt_, cfg_, backend_.get());   // what the backend refuses (offload's place), before the data
    // Every rank makes its groups' communicators in one order: data, tensor, pipeline, embedding.
    device_comm_ = make_device_communicator(groups_ ? *groups_->dp : *comm_, *backend_);
    if (device_comm_) data_comm_ = device_comm_.get();
    if (groups_) {
        device_tp_ = make_device_communicator(*groups_->tp, *backend_);
        device_pp_ = make_device_communicator(*groups_->pp, *backend_);
        if (groups_->emb) device_emb_ = make_device_communicator(*groups_->emb, *backend_);
        if (groups_->cp) device_cp_ = make_device_communicator(*groups_->cp, *backend_);
    }
    make_expert_groups();
    // A Hugging Face folder with a tokenizer.json (or tokenizer.model) tokenizes the corpus with it
    // unless told otherwise.
    const std::string tokenizer =
        opt_.tokenizer.empty() && fs::is_directory(opt_.model) ? tokenizer_for_folder(opt_.model) : opt_.tokenizer;
    if (run_.packing && opt_.data.empty())
        throw ConfigError("--packing packs instruction data (memfit prepare --format jsonl, then --data DIR); the "
                          "bundled corpus is text, which trains in windows of one stream already");
    // Rank 0 prepares the bundled corpus (if needed) before the others look for it.
    if (!lead_) comm_->barrier();
    data_ = resolve_data(opt_.data, tokenizer, cfg_.vocab_size);
    // --tokenizer tokenizes the bundled corpus; prepared data must have been made with it.
    if (!opt_.tokenizer.empty() && !opt_.data.empty()) {
        const std::string named = make_tokenizer(opt_.tokenizer, data_dir())->name();
        if (!data_.tokenizer.empty() && named != data_.tokenizer)
            throw ConfigError(fmt::format("--tokenizer {}: {} was prepared with {}; drop --tokenizer or prepare the "
                                          "data with it", opt_.tokenizer, opt_.data, data_.tokenizer));
    }
    if (lead_ && world_ > 1) comm_->barrier();
    // The same path can hold other files on another node.
    for (const std::string & path : {data_.train_path, data_.val_path})
        if (world_ > 1 && !path.empty())
            check_same_on_ranks(*comm_, fmt::format("{} (fingerprint {})", path, file_fingerprint(path)), path,
                                "give every rank the same data files");
    if (cfg_.vocab_size == 0) cfg_.vocab_size = data_.vocab_size;
    if (data_.vocab_size > cfg_.vocab_size)
        throw ConfigError(fmt::format("the data's vocabulary ({} tokens, {}) is larger than the model's ({}); "
                                      "use a model with a larger vocab_size or other data",
                                      data_.vocab_size, data_.tokenizer, cfg_.vocab_size));
    if (data_.val_vocab_size > cfg_.vocab_size)
        throw ConfigError(fmt::format("{}: its vocabulary ({} tokens) is larger than the model's ({}); prepare the "
                                      "validation data with the training data's tokenizer", data_.val_path,
                                      data_.val_vocab_size, cfg_.vocab_size));
    cfg_.validate();
    // Without --memory-budget the plan must still fit the memory this process can have; ranks on
    // one machine share it (and every rank plans with the same number: the smallest).
    if (!run_.budget) {
        const char * local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        const uint64_t per_host = local ? std::max<uint64_t>(1, std::strtoull(local, nullptr, 10)) : 1;
        run_.budget = default_budget(*backend_, std::min<uint64_t>(per_host, uint64_t(world_)));
        if (world_ > 1) {
            const auto all = comm_->all_gather_u64(run_.budget);
            run_.budget = *std::min_element(all.begin(), all.end());
        }
    }
}

// Every rank resolves the configuration as rank 0 would (every rank's program has the same
// buffers, so --fit auto and --recompute budget make the same choice on all); then each builds
// its own (a stage's program is its own).
void TrainingRun::resolve() {
    ResolvedRun resolved;
    try {
        resolved = resolve_run(run_, cfg_, *backend_, !data_.val_path.empty() && !opt_.profile,
                               groups_ ? groups_->coords.pp : 0);
    } catch (const PlanRefused & e) {
        fail_refused_plan(e, e.smallest);   // the smallest configuration tried
    }
    eo_ = resolved.eo;
    notes_ = resolved.notes;
    eo_.rank = rank_ * cp_ + cp_rank_;   // its place in the data group (context ranks innermost)
    eo_.cp_rank = cp_rank_;
    eo_.checking = opt_.check_lifetimes;
    eo_.comm = data_comm_;
    auto on_device = [](const std::unique_ptr<Communicator> & device, const std::unique_ptr<Communicator> & host) {
        return device ? device.get() : host.get();
    };
    eo_.tp_comm = groups_ ? on_device(device_tp_, groups_->tp) : nullptr;
    eo_.tp_rank = groups_ ? groups_->coords.tp : 0;
    eo_.pp_comm = groups_ ? on_device(device_pp_, groups_->pp) : nullptr;
    eo_.emb_comm = groups_ ? on_device(device_emb_, groups_->emb) : nullptr;
    eo_.cp_comm = groups_ ? on_device(device_cp_, groups_->cp) : nullptr;
    use_expert_groups();
    batch_ = eo_.B * ranks_;
    accum_ = eo_.grad_accum;
    // The loader yields the whole global batch per step, so a run-time re-plan to a smaller
    // micro-batch sees the same sequences; every rank reads it and keeps its rows of each of the
    // configuration's micro-batches (rows r*B/N .. (r+1)*B/N-1 of each B).
    const bool pairs = eo_.pref.enabled();
    if (pairs) check_preference_data(data_.train_path, batch_ / ranks_);
    train_data_ = std::make_unique<DataLoader>(data_.train_path, batch_ * accum_, opt_.seq, opt_.seed, run_.packing,
                                               pairs);
    if (eo_.with_eval)
        val_data_ = std::make_unique<DataLoader>(data_.val_path, batch_, opt_.seq, opt_.seed + 1, run_.packing, pairs);
    windows_.resize(size_t(batch_) * size_t(accum_));
    const bool steps_from_epochs = opt_.steps == 0;
    schedule_ = fill_schedule(opt_, train_data_->num_windows(), int64_t(batch_) * accum_);
    if (opt_.check_leaks && opt_.steps < 4)
        throw ConfigError(fmt::format("--check-leaks compares steps 2 and 3: needs --steps 4 or more (got {})",
                                      opt_.steps));
    if (steps_from_epochs) check_complete();
}

void TrainingRun::announce() {
    for (const auto & n : notes_) say(n);
    const ModelConfig & cfg = cfg_;
    say(fmt::format("memfit {}: model {} ({}, vocab {}, {:.2f}M parameters)", opt_.profile ? "profile" : "train",
                    cfg.name, cfg.describe(), cfg.vocab_size, double(cfg.num_params()) / 1e6));
    say(fmt::format("  data {} ({}), batch {} x seq {}{} = {} tokens/step, {} steps, {} threads{}", data_.train_path,
                    data_.tokenizer, batch_, opt_.seq,
                    accum_ > 1 ? fmt::format(" x {} accumulated micro-batches", accum_) : "",
                    batch_ * opt_.seq * accum_, opt_.steps, omp_get_max_threads(), ranks_ > 1 ? " per rank" : ""));
    say(schedule_.line);
    if (!schedule_.warning.empty()) warn(schedule_.warning);
    if (train_data_->documents()) {
        const auto & s = train_data_->document_stats();
        say(fmt::format("  instruction data: {} documents{}{}{}, {} in {} rows of {} ({}), {:.1f}% of the token slots "
                        "trained",
                        s.documents,
                        s.prompt_cut ? fmt::format(", {} with their prompt's start left out to fit", s.prompt_cut) : "",
                        s.truncated ? fmt::format(", {} truncated to --seq + 1 tokens", s.truncated) : "",
                        s.dropped ? fmt::format(", {} without a trained token left out", s.dropped) : "",
                        run_.packing ? "packed" : "one per row", train_data_->num_windows(), opt_.seq,
                        run_.packing ? "no document sees another" : "padded",
                        100.0 * double(s.trained) / (double(train_data_->num_windows()) * opt_.seq)));
    }
    if (ranks_ > 1 || eo_.zero > 0)
        say(fmt::format("  data parallel: {} rank{} ({}), micro-batch {} per rank, ZeRO stage {}, gradient buckets {}",
                        ranks_, ranks_ > 1 ? "s" : "", data_comm_->name(), eo_.B, eo_.zero,
                        eo_.bucket_bytes ? format_bytes(eo_.bucket_bytes) : std::string("one per block")));
    if (eo_.offload > 0) {   // where the offloaded bytes go (their size: the memory plan's "+ offloaded")
        const bool master = eo_.compute != DType::f32 && !eo_.sr_master;
        const std::string what = eo_.offload_params ? (master ? "the master weights, optimizer states and weights' "
                                                                "ZeRO-3 shard"
                                                              : "the optimizer states and the weights' ZeRO-3 shard")
                                 : master ? "the master weights and optimizer states"
                                          : "the optimizer states";
        say(fmt::format("  offload: {}{} to {}, staged through the device{}", eo_.offload < 1 ?
                            fmt::format("{:g} of ", eo_.offload) : std::string(), what,
                        eo_.offload_dir.empty() ? std::string("pinned host memory") : "a file under " + eo_.offload_dir,
                        eo_.offload_params ? " (each layer's part read a layer ahead of its gather)" : ""));
    }
    if (eo_.offload_activations)
        say(fmt::format("  offload: the saved activations of {} to {}, each layer's written after its forward and "
                        "read back a layer ahead of its backward", eo_.offload_activation_layers > 0 ?
                            fmt::format("the first {} layers", eo_.offload_activation_layers) : std::string("every layer"),
                        eo_.offload_dir.empty() ? std::string("pinned host memory") : "a file under " + eo_.offload_dir));
    if (cp_ > 1)
        say(fmt::format("  context parallel: {} ranks per sequence, each {} of its {} positions (chunks {} and {} of "
                        "{}), keys and values all-gathered per layer", cp_, opt_.seq / cp_, opt_.seq, cp_rank_,
                        2 * cp_ - 1 - cp_rank_, 2 * cp_));
    if (layout_.tp > 1) {
        const ModelConfig slice = tp_local_config(cfg, layout_.tp);
        say(fmt::format("  tensor parallel: {} ranks per group, each {} of {} heads ({} of {} KV), MLP {} of {}, "
                        "vocabulary rows {} of {}", layout_.tp, slice.n_head, cfg.n_head, slice.kv_heads(),
                        cfg.kv_heads(), slice.ffn_dim(), cfg.ffn_dim(), slice.vocab_size, cfg.vocab_size));
    }
    if (eo_.expert_parallel > 1) say(expert_line(cfg));
    if (layout_.pp > 1) {
        std::string stages;
        const int V = eo_.schedule == PipeSchedule::interleaved ? eo_.virtual_stages : 1;
        for (const auto & r : pipeline_stages(tp_local_config(cfg, layout_.tp), layout_.pp * V, opt_.seq))
            stages += fmt::format("{}[{}, {})", stages.empty() ? "" : " ", r.begin, r.end);
        say(fmt::format("  pipeline parallel: {} stages, blocks {}{}, schedule {}, {} micro-batches of {} per step",
                        layout_.pp, stages, V > 1 ? fmt::format(" (virtual stage v on stage v mod {})", layout_.pp) : "",
                        V > 1 ? schedule_spelling(run_.layout) : schedule_name(eo_.schedule), accum_, eo_.B));
    }
    if (eo_.lora.enabled()) {
        const size_t A = lora_param_count(cfg, eo_.lora);
        say(fmt::format("  {} rank {} alpha {:g}{} on {}: {:.3f}M trainable parameters ({:.2f}% of the model); base "
                        "frozen{}",
                        eo_.lora.dora ? "DoRA (magnitude per output row)" : "LoRA", eo_.lora.rank, eo_.lora.alpha,
                        eo_.lora.rslora ? fmt::format(" (rsLoRA: scale {:g})", eo_.lora.scaling()) : std::string(),
                        fmt::join(eo_.lora.targets, ","), double(A) / 1e6,
                        100.0 * double(A) / double(cfg.num_params()),
                        eo_.lora.base == BaseWeights::gptq
                            ? fmt::format(", projections gptq ({}-bit, groups of {}, the folder's packed weights)",
                                          eo_.lora.gptq_bits, eo_.lora.gptq_group)
                        : eo_.lora.quantized() ? fmt::format(", projections {}", quant_format_name(eo_.lora.format()))
                                               : fmt::format(" in {}", precision_name(eo_.compute))));
    }
    if (eo_.sparsity.enabled())
        say(fmt::format("  sparsity {}: block projections pruned by magnitude {}, then masked (the pruned weights "
                        "stay zero)", eo_.sparsity.name(),
                        eo_.sparsity.start == 0 ? std::string("before this run's first update")
                                                : fmt::format("once {} update{} in", eo_.sparsity.start,
                                                              eo_.sparsity.start == 1 ? " is" : "s are")));
}

void TrainingRun::build() {
    const uint64_t fixed_rss = current_rss_bytes();   // the process before the plan's buffers
    try {
        engine_ = std::make_unique<Engine>(cfg_, *backend_, eo_);
    } catch (const OutOfMemory & e) {
        fail_refused_plan(e, eo_);
    }
    Engine & engine = *engine_;
    const CategoryBytes plan_live = engine.planned_peak_live(), plan_rsv = engine.planned_reserved();
    say(fmt::format("memory plan{} ({} ops, {}{}, peak at op {} '{}'):\n{}",
                    layout_.tp * layout_.pp > 1 ? " of rank 0 (every rank's: at the end)" : world_ > 1 ? " per rank" : "",
                    engine.step().program().num_ops(), precision_name(eo_.compute),
                    eo_.compute == DType::f32 ? ""
                        : fmt::format(" with fp32 master weights, {} gradients{}", precision_name(eo_.grad_dtype()),
                                      accum_ <= 1 ? ""
                                      : eo_.zero >= 2 ? fmt::format(" (accumulated in the shard; each micro-batch's "
                                                                    "buckets {})", precision_name(eo_.compute))
                                                      : " (accumulated over micro-batches)"),
                    engine.plan().peak_op, engine.step().program().ops()[size_t(engine.plan().peak_op)].name,
                    format_plan_table(plan_live, plan_rsv)));
    if (eo_.budget)
        say(fmt::format("  budget {} ({}): fits; the budget holds the plan's buffers; the process adds {} measured "
                        "before them (code, libraries, tokenizer, data){}",
                        format_bytes(eo_.budget), opt_.budget == 0 ? "available memory" : "--memory-budget",
                        format_bytes(fixed_rss),
                        backend_->host_memory()
                            ? fmt::format(": about {} in all", format_bytes(fixed_rss + plan_rsv.total()))
                            : std::string(", in host memory")));
    engine.init_params(opt_.seed);
    if (has_hf_weights(opt_.model)) {
        if (eo_.lora.base == BaseWeights::gptq) {   // a GPTQ folder: its packed projections as they are
            const GptqModel g = read_gptq_folder(opt_.model);
            base_digest_ = bytes_digest(g.params.data(), g.params.size() * sizeof(float));
            engine.set_base(g.params.data(), &g.packed);
        } else if (eo_.lora.enabled()) {
            std::vector<float> full(size_t(cfg_.num_params()));
            load_hf_weights(opt_.model, cfg_, make_param_layout(cfg_), full.data());
            base_digest_ = bytes_digest(full.data(), full.size() * sizeof(float));
            engine.set_base(full.data());
        } else if (layout_.tp > 1 || layout_.pp > 1) {   // the whole model; each rank keeps its part
            std::vector<float> full(size_t(cfg_.num_params()));
            load_hf_weights(opt_.model, cfg_, make_param_layout(cfg_), full.data());
            engine.set_params(full.data());
        } else {
            load_hf_weights(opt_.model, cfg_, engine.step().layout(), engine.params());
            engine.params_changed();
        }
        say(fmt::format("  weights from {}", opt_.model));
    }
    if (eo_.distill.enabled()) {   // the frozen teacher (model/distill.h)
        const ModelConfig & tc = *eo_.distill.teacher;
        if (!has_hf_weights(opt_.distill.teacher))
            throw ConfigError(fmt::format("--teacher {}: no weights there (model.safetensors); a teacher must be a "
                                          "trained model: a Hugging Face folder or `memfit export`'s output",
                                          opt_.distill.teacher));
        std::vector<float> full(size_t(tc.num_params()));
        const ParamLayout teacher_layout = make_param_layout(tc);
        load_hf_weights(opt_.distill.teacher, tc, teacher_layout, full.data());
        // sparse24 keeps 2 of every 4 weights: lossless for a teacher trained 2:4 sparse, half its
        // weights dropped for any other.
        if (eo_.distill.weights == BaseWeights::sparse24) {
            const NmSparsity two_four{2, 4, 0};
            if (const size_t bad = nm_violations(tc, teacher_layout, full.data(), two_four); bad > 0)
                throw ConfigError(fmt::format("--teacher-weights sparse24: {} is not 2:4 sparse ({} groups of 4 hold "
                                              "more than 2 nonzero weights), so packing it would drop half its "
                                              "weights; use --teacher-weights nf4 or int8, or a teacher trained "
                                              "with --sparsity 2:4", opt_.distill.teacher, bad));
        }
        engine.set_teacher(full.data());
        say(fmt::format("  teacher {} ({:.2f}M parameters, {} weights): loss (1 - {:g}) x cross-entropy + {:g} x T^2 x "
                        "KL at T = {:g}; validation reports the cross-entropy",
                        opt_.distill.teacher, double(tc.num_params()) / 1e6,
                        eo_.distill.quantized() ? base_weights_name(eo_.distill.weights) : precision_name(eo_.compute),
                        eo_.distill.alpha, eo_.distill.alpha, eo_.distill.temperature));
    }
    if (eo_.pref.enabled()) start_preference();   // from the starting weights, before a resume replaces them
    if (!resume_.empty())
        first_step_ = resume_from(resume_, cfg_, opt_, run_.global_batch, engine, *train_data_, val_data_.get(),
                                  base_digest_) + 1;
    // The run's identity: a resumed run's is its checkpoint's, a new run's its own.
    run_id_ = new_run_id();
    if (!resume_.empty()) {
        const std::string dir = find_checkpoint(resume_);
        const nlohmann::json meta = load_checkpoint_meta(dir);
        run_id_ = json_string_or(meta, "run_id");
        skip_batches_ = read_skipped_batches(dir);
        const auto loss = meta.contains("loss") ? json_number<double>(meta["loss"]) : std::nullopt;
        resumed_ = ResumedLoss{dir, first_step_ - 1, loss ? *loss : NAN, 2 * std::log(double(cfg_.vocab_size))};
    }
    if (lead_) {
        lock_fd_ = lock_folder(opt_.out, "--out");
        if (!within(checkpoint_root(), opt_.out)) ckpt_lock_fd_ = lock_folder(checkpoint_root(), "--checkpoint-dir");
        if (opt_.checkpoint_every > 0 || opt_.save_final) {
            check_writable(checkpoint_root(), "--checkpoint-dir");
            if (opt_.checkpoint_every > 0) check_own_checkpoints(checkpoint_root(), run_id_);
            else warn_other_runs();
            check_free_space(checkpoint_root(), uint64_t(engine.total_params()) * 12 + 4096 * uint64_t(world_),
                             opt_.keep_checkpoints,
                             [this](const std::string & w) { warn(w); });
        }
    }
    // What a checkpoint costs (this rank's part of the state: weights and both moments in fp32),
    // so that --stop-grace can be set to cover it.
    if (lead_) {
        const CheckpointCost cost = predict_checkpoint_cost(opt_.out, checkpoint_bytes(engine, world_));
        checkpoint_seconds_ = cost.seconds;
        if (!cost.error.empty())
            warn(fmt::format("a checkpoint ({}) may fail: a probe of its write failed: {}",
                             format_bytes(cost.bytes), cost.error));
        else
            say(fmt::format("  a checkpoint: {}{}, about {:.2g} s to write ({:.0f} MB/s write, {:.0f} MB/s digest "
                            "measured in {}); {} stop the run at a step boundary with one, within --stop-grace {:g} s",
                            format_bytes(cost.bytes), world_ > 1 ? " per rank" : "", cost.seconds,
                            cost.write_bytes_per_s / 1e6, cost.digest_bytes_per_s / 1e6, opt_.out,
                            opt_.stop_signals == "none" ? std::string("no signals") : stop_signal_list(opt_.stop_signals),
                            opt_.stop_grace));
    }
    metrics_path_ = (fs::path(opt_.out) / "metrics.jsonl").string();
    if (lead_) {
        fs::create_directories(opt_.out);
        // A resumed run keeps the lines of the steps it continues from and appends its own.
        std::string kept;
        if (first_step_ > 1) {
            std::ifstream in(metrics_path_);
            for (std::string line; std::getline(in, line);) {
                const std::optional<nlohmann::json> j = try_parse_json(line);
                if (j && j->is_object() && j->contains("step") && (*j)["step"].is_number_integer() &&
                    (*j)["step"].get<int64_t>() < first_step_)
                    kept += line + "\n";
            }
        }
        // Rewritten whole (or left as it was, if that fails), then appended to.
        write_file_atomic(metrics_path_, kept);
        metrics_ = std::fopen(metrics_path_.c_str(), "a");
        if (!metrics_)
            throw IoError(fmt::format("{}: cannot open for appending ({})", metrics_path_, std::strerror(errno)));
    }
    start_watch();
    const size_t BT = size_t(batch_) * size_t(opt_.seq) * size_t(accum_);   // tokens per step
    in_.resize(BT);
    tg_.resize(BT);
    my_in_.resize(BT / size_t(ranks_) / size_t(cp_));
    my_tg_.resize(BT / size_t(ranks_) / size_t(cp_));
    ds_.resize(BT);
    my_ds_.resize(BT / size_t(ranks_) / size_t(cp_));
    sched_ = LrSchedule{opt_.lr, opt_.warmup, opt_.steps, opt_.min_lr_ratio, opt_.lr_decay};
}

// This rank's rows: of every `rows`-sequence group of the global batch, the r-th 1/N; under
// context parallelism, of each row its two chunks (model/context_parallel.h).
void TrainingRun::take_rows(int rows, int groups) {
    const size_t mine = size_t(rows / ranks_) * size_t(opt_.seq), whole = size_t(rows) * size_t(opt_.seq);
    const ContextParallel cp{cp_, cp_rank_};
    const int T = opt_.seq, Tl = T / cp_;
    for (int g = 0; g < groups; ++g) {
        const size_t src = size_t(g) * whole + size_t(rank_) * mine, dst = size_t(g) * mine / size_t(cp_);
        for (size_t row = 0; row < size_t(rows / ranks_); ++row)
            for (int t = 0; t < Tl; ++t) {
                const size_t from = src + row * size_t(T) + size_t(cp.position(t, T)), to = dst + row * size_t(Tl) + size_t(t);
                my_in_[to] = in_[from], my_tg_[to] = tg_[from], my_ds_[to] = ds_[from];
            }
    }
}

// Tests: the rows of the global batch that data-parallel rank 0 takes get the vocabulary's last
// id as every target (the bytes tokenizer's 255, which text never has): a loss spike.
void TrainingRun::spoil_rows(int rows, int groups) {
    const size_t mine = size_t(rows / ranks_) * size_t(opt_.seq), whole = size_t(rows) * size_t(opt_.seq);
    for (int g = 0; g < groups; ++g)
        for (size_t i = 0; i < mine; ++i)
            if (int32_t & t = tg_[size_t(g) * whole + i]; t >= 0) t = cfg_.vocab_size - 1;
}

// Batches of the starting micro-batch (this rank's rows), run in pieces of the engine's current
// one; eval_loss sums over the ranks.
float TrainingRun::evaluate() {
    const int b = engine_->options().B, local = batch_ / ranks_, pieces = local / b;
    double s = 0;
    val_pref_ = {};
    for (int i = 0; i < opt_.eval_batches; ++i) {
        val_data_->next(in_.data(), tg_.data(), ds_.data(), windows_.data());
        take_rows(batch_, 1);
        const float * ref = my_reference(val_ref_, windows_, batch_, 1);
        for (int k = 0; k < pieces; ++k) {
            const size_t off = size_t(k) * size_t(b) * size_t(opt_.seq / cp_);
            s += engine_->eval_loss(my_in_.data() + off, my_tg_.data() + off, my_starts() ? my_starts() + off : nullptr,
                                    ref ? ref + size_t(k) * size_t(b) : nullptr);
            val_pref_.add(engine_->eval_preference());
        }
    }
    return float(s / (opt_.eval_batches * pieces));
}

void TrainingRun::train() {
    const auto t_start = Clock::now();
    // One process can abandon the step in flight when the grace time left would not let it end.
    if (world_ == 1) engine_->set_cancel([this] { return stop_requested() && abandon_step(); });
    last_step_ = first_step_ - 1;
    // Tests only: this process leaves at that step, as a rank that ends early would (the watchdog's test).
    const char * exit_at = std::getenv("MEMFIT_TEST_EXIT_AT_STEP");
    // Tests only: the N-th transient buffer the steps acquire fails, as an allocation would.
    if (const char * n = std::getenv("MEMFIT_TEST_FAIL_ACQUIRE")) inject_acquire_failure(std::atol(n));
    for (int s = first_step_; s <= opt_.steps; ++s) {
        if (exit_at && s == std::atoi(exit_at)) std::exit(0);
        set_comm_step(s);
        if (stop_now()) break;
        const uint64_t epoch = train_data_->epoch();
        const size_t cursor = train_data_->cursor();
        try {
            step(s);
        } catch (const StepAbandoned &) {
            train_data_->seek(epoch, cursor);   // the step did not happen: nor did its batch
            abandoned_ = true;
            break;
        }
        last_step_ = s;
        if (roll_back_now_) s = last_step_ = roll_back();   // the loop goes on from the checkpoint's next step
    }
    engine_->set_cancel(nullptr);
    if (last_step_ < opt_.steps) stopped(last_step_);
    if (metrics_) std::fclose(metrics_);
    metrics_ = nullptr;
    progress_.finish();
    wall_ = std::chrono::duration<double>(Clock::now() - t_start).count();
}

void TrainingRun::step(int step) {
    const TrainOptions & opt = opt_;
    const int BT = batch_ * opt.seq * accum_;
    // Batches a roll-back left out (--spike-rollback) are passed over.
    while (skip_batches_.count({train_data_->epoch(), train_data_->cursor()}))
        train_data_->next(in_.data(), tg_.data(), ds_.data());
    batch_at_ = {train_data_->epoch(), train_data_->cursor()};
    train_data_->next(in_.data(), tg_.data(), ds_.data(), windows_.data());
    // The configuration's micro-batches (run.batch sequences each over all ranks) split over the
    // ranks; --fit auto may regroup this rank's rows into other micro-batches (the same global batch).
    if (bad_batches_.count(step)) spoil_rows(run_.batch, run_.grad_accum);
    take_rows(run_.batch, run_.grad_accum);
    std::string budget_warning;
    if (const auto b = budget_file_.poll(&budget_warning)) shrink_to_budget(engine_, cfg_, *backend_, *b, replans_);
    if (!budget_warning.empty()) warn(budget_warning);
    OptimHyper h{sched_.at(step), opt.beta1, opt.beta2, opt.eps, opt.weight_decay, step, opt.clip};
    h.momentum = opt.momentum;
    h.galore_update_gap = opt.galore_update_gap, h.galore_scale = opt.galore_scale;
    h.adafactor_beta1 = run_.adafactor_beta1;
    if (spikes_.enabled()) {
        const double norm_limit = spikes_.norm_threshold();
        h.skip_nonfinite = true;
        if (norm_limit > 0) h.skip_above_norm_sq = float(norm_limit * norm_limit);
        h.skip_above_loss = float(spikes_.loss_threshold());
    }
    if (const auto it = injected_.find(step); it != injected_.end()) h.loss_grad_factor = it->second;
    // Every step is recorded op by op: the last for the report, the others in case one fails.
    Timeline * recording = step == opt.steps                   ? &timeline_
                           : opt.check_leaks && step == 2 ? &leak_a_
                           : opt.check_leaks && step == 3 ? &leak_b_
                                                          : &flight_;
    engine_->set_timeline(recording);
    const auto t0 = Clock::now();
    step_t0_ = t0;
    StepResult r;
    try {
        r = resilient_step(engine_, cfg_, *backend_, my_in_.data(), my_tg_.data(), h, replans_, my_starts(),
                           my_reference(train_ref_, windows_, run_.batch, run_.grad_accum));
    } catch (const OutOfMemory & e) {
        fail_out_of_memory(e, step, *recording);
    }
    for (const auto & n : replans_) say(n);
    replans_.clear();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    step_seconds_ = dt;
    engine_->set_timeline(nullptr);
    if (opt.check_leaks && step == 3) {
        const std::string diff = compare_live_bytes(leak_a_, leak_b_);
        if (!diff.empty()) throw Error("leak check failed: " + diff);
        say(fmt::format("leak check: live bytes identical at all {} ops of steps 2 and 3", leak_b_.events.size()));
    }
    loss_curve_.push_back({step, r.loss});
    if (r.pref.pairs > 0) {
        margins_curve_.push_back({step, r.pref.margin()});
        accuracy_curve_.push_back({step, r.pref.accuracy()});
    }
    tps_curve_.push_back({step, double(BT) / dt});
    if (!r.expert_tokens.empty()) {
        nlohmann::json moe;
        add_moe_metrics(moe, r);
        aux_curve_.push_back({step, moe["moe/aux_loss"].get<double>()});
        load_curve_.push_back({step, moe["moe/max_load"].get<double>()});
        expert_tokens_ = moe["moe/tokens_per_expert"].get<std::vector<std::vector<double>>>();
    }
    const std::string spike = note_spike(r, step, h);
    // Diverged: stop before the checkpoint (fp16's non-finite gradients are the loss scaler's:
    // it skips those updates, as --skip-spikes does).
    const bool spike_skipped = spikes_.enabled() && r.skipped;
    const bool bad_grads = !std::isfinite(r.grad_norm) && eo_.compute != DType::f16 && !spike_skipped;
    if ((!std::isfinite(r.loss) && !spike_skipped) || bad_grads) {
        DivergenceFacts f;
        f.step = step;
        f.first_step = first_step_;
        f.lr = h.lr;
        f.peak_lr = opt.lr;
        f.warmup = opt.warmup;
        f.clip = opt.clip;
        f.last_grad_norm = last_grad_norm_;
        f.compute = eo_.compute;
        f.lora_scale = eo_.lora.enabled() ? eo_.lora.scaling() : 0.0f;
        f.weights_from = !resume_.empty()            ? "--resume " + resume_
                         : has_hf_weights(opt.model) ? opt.model
                                                     : fmt::format("initialised from --seed {}", opt.seed);
        throw Error(std::isfinite(r.loss) ? divergence_message("gradient norm", r.grad_norm, f)
                                          : divergence_message("loss", r.loss, f));
    }
    if (const std::string why = resumed_loss_check(resumed_, step, r.loss); !why.empty()) throw Error(why);
    last_grad_norm_ = r.grad_norm;
    // fp16: overflowing steps are skipped while the scale comes down; once it cannot (a static
    // scale, or the dynamic one at its minimum) more of them would be a run that does nothing.
    const LossScaler & ls = engine_->loss_scaler();
    skipped_in_a_row_ = r.skipped ? skipped_in_a_row_ + 1 : 0;
    if (skipped_in_a_row_ >= kMaxSkippedInARow && (!ls.dynamic || ls.scale <= ls.min_scale))
        throw Error(fmt::format("fp16: the last {} steps overflowed at loss scale {:g}, which {}; hint: {}",
                                skipped_in_a_row_, ls.scale,
                                ls.dynamic ? "is --min-loss-scale" : "is static (--loss-scale)",
                                ls.dynamic ? "lower --min-loss-scale or use --precision bf16"
                                           : "lower --loss-scale, use the dynamic scale (--loss-scale 0) or "
                                             "--precision bf16"));
    total_time_ += dt;
    total_tokens_ += BT;
    trained_tokens_ += r.tokens;
    last_loss_ = r.loss;
    const bool do_eval = eo_.with_eval && ((opt.eval_every > 0 && step % opt.eval_every == 0) || step == opt.steps);
    if (do_eval) {
        try {
            last_val_ = evaluate();
        } catch (const OutOfMemory & e) {
            fail_out_of_memory(e, step, *recording);   // evaluation's program is not recorded: the step's is shown
        }
        val_curve_.push_back({step, last_val_});
    }
    const auto & L = engine_->ledger();
    // Every rank's memory is gathered at the log points every rank knows of (a spike's is rank 0's).
    const bool watch_point = step % opt.log_every == 0 || step == 1 || step == opt.steps || do_eval;
    const bool log_point = watch_point || !spike.empty();
    ProgressLine pl;
    pl.step = step;
    pl.total_steps = opt.steps;
    pl.loss = r.loss;
    pl.val_loss = do_eval ? double(last_val_) : NAN;
    pl.lr = h.lr;
    pl.grad_norm = r.grad_norm;
    pl.tokens_per_s = double(BT) / dt;
    if (train_data_->documents()) pl.trained_per_s = double(r.tokens) / dt;
    pl.ms_per_step = dt * 1e3;
    pl.eta_s = total_time_ / step * (opt.steps - step);
    pl.live = L.live_total();
    pl.peak = L.live_total_peak();
    pl.budget = eo_.budget;
    progress_.update(pl, log_point);
    if (watch_point) ranks_memory_ = watch(step, pl, r);
    // A bad step was not applied: the checkpoint after it holds the state before it, which is
    // where a roll-back returns.
    const bool last = step == opt.steps && opt.save_final;
    if ((opt.checkpoint_every > 0 && step % opt.checkpoint_every == 0) || last) checkpoint(step, log_point || last);
    if (last) retire_other_runs();
    if (log_point && lead_) {
        nlohmann::json m = {{"step", step}, {"loss", r.loss}, {"lr", json_float(h.lr)}, {"grad_norm", r.grad_norm},
                            {"tokens_per_s", double(BT) / dt}, {"trained_tokens", r.tokens},
                            {"trained_tokens_per_s", double(r.tokens) / dt}, {"ms", dt * 1e3}, {"live_bytes", L.live_total()},
                            {"peak_bytes", L.live_total_peak()}};
        if (do_eval) m["val_loss"] = last_val_;
        add_preference_metrics(m, r, do_eval);
        add_moe_metrics(m, r);
        if (!spike.empty()) m["spike"] = spike;
        m["ranks"] = ranks_memory_;
        if (eo_.compute == DType::f16) {
            m["loss_scale"] = r.loss_scale;
            m["skipped_steps"] = engine_->loss_scaler().skipped;
        }
        write_metrics(m);
    }
}

// A metrics line that cannot be written (a full disk) is lost, not the run: one warning, the
// count in summary.json, and the next line tried again.
void TrainingRun::write_metrics(const nlohmann::json & m) {
    if (std::fprintf(metrics_, "%s\n", m.dump().c_str()) >= 0 && std::fflush(metrics_) == 0) return;
    const int err = errno;
    std::clearerr(metrics_);
    if (metrics_lost_++ == 0)
        warn(fmt::format("{}: cannot write the line of step {} ({}); training goes on, and lines that cannot be "
                         "written are counted in summary.json", metrics_path_, m.value("step", 0), std::strerror(err)));
}

void run_training(const TrainOptions & opt) {
    TrainingRun run(opt);
    if (run.complete()) return;
    run.load();
    run.resolve();
    if (run.complete()) return;   // --resume auto at the last step of --epochs
    run.announce();
    run.build();
    run.train();
    run.finish();
}

}  // namespace memfit
