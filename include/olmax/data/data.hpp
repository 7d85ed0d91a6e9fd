#pragma once
// Module header: byte tokenizer, corpus reading (file or folder; default: Debian `fortunes`),
// train/held-out split, the document-packing loader with resumable position, token sampling.
#include "olmax/data/corpus.hpp"
#include "olmax/data/loader.hpp"
#include "olmax/data/sampling.hpp"
#include "olmax/data/shuffle.hpp"
#include "olmax/data/tokenizer.hpp"
