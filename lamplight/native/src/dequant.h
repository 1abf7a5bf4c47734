// Rows of a GGUF tensor, dequantized to float32 from its blocks as the file stores them: the
// token-embedding lookup of each step (lamplight/native/lookup.py), which gguf's numpy
// dequantizer did in Python, waiting on the GIL between its operations in a busy server.
#pragma once
#include <cstdint>

extern "C" {
// out[i, 0..n_cols) = row ids[i] of `table` (n_table_rows rows of row_bytes bytes, each n_cols
// values of GGML type `ggml_type`), with gguf's float32 arithmetic: the same bits as its
// dequantizer. LP_ERR_UNSUPPORTED for a type not handled here (the caller falls back to gguf's),
// LP_ERR_ARGUMENT for an id outside the table or a row size that does not match the type.
int32_t lp_dequantize_rows(int32_t ggml_type, const uint8_t* table, int64_t n_table_rows, int64_t row_bytes,
                           int64_t n_cols, const int64_t* ids, int64_t n_ids, float* out);
}
