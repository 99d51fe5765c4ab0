// See gloo_declarations/README.md: nothing from this header is used.
#pragma once
