// gpufleet serve: run the page this is (common.js and the page files, loaded before, define them).
"use strict";

PAGES[boot.page]();
