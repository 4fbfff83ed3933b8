#pragma once
// The CPU backend: every op (include/mom/backend/cpu/*.hpp) and mom::cpu::Backend<T>.
#include "mom/backend/cpu/activation.hpp"
#include "mom/backend/cpu/attention.hpp"
#include "mom/backend/cpu/backend.hpp"
#include "mom/backend/cpu/cross_entropy.hpp"
#include "mom/backend/cpu/dispatch.hpp"
#include "mom/backend/cpu/embedding.hpp"
#include "mom/backend/cpu/gemm.hpp"
#include "mom/backend/cpu/gru.hpp"
#include "mom/backend/cpu/layernorm.hpp"
#include "mom/backend/cpu/linear.hpp"
#include "mom/backend/cpu/optim.hpp"
#include "mom/backend/cpu/topk.hpp"
