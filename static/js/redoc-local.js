// Loaded before ReDoc's bundle: ReDoc puts its vendor's logo, an image from cdn.redoc.ly, in the side menu of every
// page it draws, and Tandem loads nothing from other hosts (the Content-Security-Policy would block it and log an
// error). An image address on another host is dropped before the browser asks for it; the link text stays.
(function () {
  "use strict";

  function elsewhere(value) {
    return new URL(String(value), location.href).origin !== location.origin;
  }

  const setAttribute = Element.prototype.setAttribute;
  Element.prototype.setAttribute = function (name, value) {
    if (this instanceof HTMLImageElement && name.toLowerCase() === "src" && elsewhere(value)) return;
    setAttribute.call(this, name, value);
  };
  const src = Object.getOwnPropertyDescriptor(HTMLImageElement.prototype, "src");
  Object.defineProperty(HTMLImageElement.prototype, "src", {
    configurable: true,
    enumerable: src.enumerable,
    get: src.get,
    set: function (value) {
      if (!elsewhere(value)) src.set.call(this, value);
    },
  });
})();
