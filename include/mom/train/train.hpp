// The bundled training loop, one include: tokenizers, token files and sampling, safetensors checkpoints,
// metrics and the Trainer (docs/training.md).
#pragma once
#include <mom/train/checkpoint.hpp>
#include <mom/train/data.hpp>
#include <mom/train/file_io.hpp>
#include <mom/train/metrics.hpp>
#include <mom/train/safetensors.hpp>
#include <mom/train/tokenizer.hpp>
#include <mom/train/trainer.hpp>
