// Samples text from a checkpoint written by train_lm:
//     build/examples/generate --checkpoint_dir=runs/train_lm --prompt="The meaning of life"
//         --sample_bytes=400 --temperature=0.8 --top_k=40 --top_p=0.95
// The model's shape comes from the config stored in the checkpoint; sampling keys given on the
// command line (prompt, sample_bytes, temperature, top_k, top_p, seed, decode) override it. A
// positional argument names a checkpoint file instead of the newest one in --checkpoint_dir. The
// text is printed as it is sampled; stderr then says how many bytes were drawn per second.
// Ctrl-C (SIGINT) or SIGTERM stops after the byte being drawn: the text so far, a line saying so
// on stderr, exit status 128 + the signal (130, 143).
//
// --score=PATH scores a text instead of sampling: the bits per byte the checkpoint's model spends
// on each document of PATH (a file or folder, read as train_lm's --data is), predicted byte by byte
// as sampling reads them (--decode), printed as one line on stdout. --score=held_out scores the
// checkpoint's own held-out documents (its --data, --held_out_fraction and --seed; the data must be
// on this machine). A signal stops it after the document being scored.

#include <algorithm>
#include <chrono>
#include <iostream>

#include <olmax/olmax.hpp>

namespace {

namespace config = olmax::config;
namespace io = olmax::io;

// train_lm's keys (the checkpoint's config) and generate's own.
struct GenerateConfig : olmax::train::TrainConfig {
    std::string score;  // empty: sample

    static const std::vector<config::Field<GenerateConfig>>& fields() {
        static const auto f = config::concat_fields(
            config::section_fields<GenerateConfig, olmax::train::TrainConfig>(),
            std::vector<config::Field<GenerateConfig>>{{"score", &GenerateConfig::score,
                                                        "score this file or folder (or `held_out`: the checkpoint's held-out documents) "
                                                        "in bits per byte instead of sampling"}});
        return f;
    }
};

// The documents --score names, with what was read said on stderr.
olmax::data::Documents documents_to_score(const GenerateConfig& c) {
    if (c.score == "held_out") {
        auto text = olmax::train::read_text_data(c.data, c.held_out_fraction, std::uint64_t(c.seed));
        for (const auto& line : text.report) std::cerr << line << "\n";
        return std::move(text.held_out);
    }
    auto corpus = olmax::data::read_corpus(c.score);
    for (const auto& line : corpus.report()) std::cerr << "score: " << line << "\n";
    return std::move(corpus.documents);
}

int run(int argc, char** argv) {
    olmax::stop_on_signals stop("generate", "stopping after this byte (with --score: after this document)");
    GenerateConfig flags;
    auto cl = config::parse_command_line(flags, argc, argv);
    if (cl.help) {
        std::cout << "usage: generate [CHECKPOINT_FILE] [--checkpoint_dir=DIR] [--prompt=TEXT] [--sample_bytes=N] [--temperature=T]"
                     " [--top_k=K] [--top_p=P] [--seed=S] [--decode=stepwise|window]"
                     " [--score=PATH|held_out]\n";
        return 0;
    }
    olmax::check<config::config_error>(cl.positional.size() <= 1, "at most one checkpoint file may be given");
    // The model's shape and training keys come from the checkpoint; changing them here could only
    // fail to load or silently mean nothing.
    static const std::vector<std::string> sampling_keys{"checkpoint_dir", "prompt", "sample_bytes", "temperature", "top_k",
                                                        "top_p",          "seed",   "decode",       "score"};
    for (const auto& key : cl.keys)
        olmax::check<config::config_error>(std::find(sampling_keys.begin(), sampling_keys.end(), key) != sampling_keys.end(), "--", key,
                                           " is fixed by the checkpoint; generate takes --checkpoint_dir, --prompt, --sample_bytes,"
                                           " --temperature, --top_k, --top_p, --seed, --decode and --score");
    if (!flags.score.empty() && flags.score != "held_out") {  // before the checkpoint is read
        const std::string problem = config::path_problem(flags.score, config::PathKind::input);
        olmax::check<config::config_error>(problem.empty(), "config: key 'score': '", flags.score, "' ", problem);
    }
    std::filesystem::path path;
    io::Archive archive;
    if (!cl.positional.empty()) {
        path = cl.positional[0];
        const std::string problem = config::path_problem(path.string(), config::PathKind::input_file);
        olmax::check<config::config_error>(problem.empty() && !path.empty(), "checkpoint file '", path.string(), "' ",
                                           path.empty() ? "is empty" : problem);
        archive = io::load_archive(path);
    } else {
        // A folder (which may not exist yet: then there is simply no checkpoint), never a file.
        const std::string problem = config::path_problem(flags.checkpoint_dir, config::PathKind::output_folder);
        olmax::check<config::config_error>(problem.empty(), "config: key 'checkpoint_dir': '", flags.checkpoint_dir, "' ", problem);
        io::CheckpointDirectory directory(flags.checkpoint_dir);
        std::vector<std::string> notices, rejected;
        const auto files = directory.list(&notices);
        for (const auto& notice : notices) std::cerr << "checkpoint folder: " << notice << "\n";
        auto loaded = directory.load_latest(files, &rejected);
        if (!loaded)
            for (const auto& why : rejected) std::cerr << "rejected checkpoint " << why << "\n";
        olmax::check<olmax::value_error>(loaded.has_value(), "no valid checkpoint in ", flags.checkpoint_dir,
                                         files.empty() ? " (train with examples/train_lm first)" : " (reasons above)");
        for (const auto& why : loaded->rejected) std::cerr << "skipped damaged checkpoint " << why << "\n";
        path = loaded->path;
        archive = std::move(loaded->archive);
    }
    // The model as it was trained, then the sampling flags from this command line on top.
    GenerateConfig c;
    config::load_text(c, archive.text("train/config"), path.string());
    config::parse_command_line(c, argc, argv);
    const std::string training_data = c.data;
    c.data.clear();  // the training data is not needed (and may not be on this machine)
    c.validate();
    c.data = training_data;  // --score=held_out reads it

    return olmax::models::with_recipe(c.block, [&]<class Recipe>() {  // the block it was trained with
        olmax::models::ByteLM<Recipe> model(c);
        io::restore_parameters(archive, model.parameters());
        std::cerr << "loaded " << path.string() << " (step " << archive.integer("train/step") << ", block " << c.block << ")\n";

        const auto decoding = olmax::train::decoding(c);
        const char* decode_name = olmax::models::ByteLM<Recipe>::steps_with(decoding) ? "stepwise" : "window";
        if (!c.score.empty()) {
            const auto documents = documents_to_score(c);
            const auto start = std::chrono::steady_clock::now();
            olmax::models::TextScore total;
            std::size_t scored = 0;
            for (; scored < documents.size() && !olmax::stop_requested(); ++scored)
                total += model.score(documents[scored], std::size_t(c.sequence), decoding);
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            std::cout << "score: " << c.score << ": " << total.bits_per_byte() << " bits/byte (" << total.nats_per_byte() << " nats/byte), "
                      << total.predictions << " predictions in " << scored << " documents, decode " << decode_name << ", window "
                      << c.sequence << ", " << seconds << " s" << std::endl;
            if (!olmax::stop_requested()) return 0;
            std::cerr << "generate: stopped by " << olmax::signal_name(olmax::stop_signal()) << " after " << scored << " of "
                      << documents.size() << " documents" << std::endl;
            return olmax::stop_signal() > 0 ? 128 + olmax::stop_signal() : 0;
        }

        olmax::Generator sampler(std::uint64_t(c.seed) + 1);
        const olmax::data::SamplingConfig sampling{c.temperature, std::size_t(c.top_k), c.top_p};
        std::cout << c.prompt << std::flush;
        const auto start = std::chrono::steady_clock::now();
        const std::size_t drawn = model.sample(
            c.prompt, std::size_t(c.sample_bytes), std::size_t(c.sequence), sampling, sampler,
            [](char byte) {
                std::cout << byte << std::flush;
                return !olmax::stop_requested();
            },
            decoding);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::cout << "\n" << std::flush;
        std::cerr << "generate: " << drawn << " bytes in " << seconds << " s (" << (seconds > 0 ? double(drawn) / seconds : 0.0)
                  << " bytes/s, decode " << decode_name << ", window " << c.sequence << ")\n";
        if (olmax::stop_requested()) {
            std::cerr << "generate: stopped by " << olmax::signal_name(olmax::stop_signal()) << " after " << drawn << " of " << c.sample_bytes
                      << " bytes" << std::endl;
            return olmax::stop_signal() > 0 ? 128 + olmax::stop_signal() : 0;
        }
        return 0;
    });
}

}  // namespace

int main(int argc, char** argv) { return olmax::config::run_program("generate", run, argc, argv); }
