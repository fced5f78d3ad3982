// Aokun panel: a little progressive enhancement; every page works without it.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  // A form with data-confirm asks first (delete).
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (ev) => {
      if (!window.confirm(form.dataset.confirm)) ev.preventDefault();
    });
  }
  // "Go back" links.
  for (const a of document.querySelectorAll("a[data-back]")) {
    a.addEventListener("click", (ev) => { ev.preventDefault(); history.back(); });
  }
  // Settings: mark changed fields and count them.
  const settings = document.getElementById("settings");
  if (settings) {
    const count = document.getElementById("changed-count");
    const update = () => {
      let n = 0;
      for (const el of settings.querySelectorAll("[data-value]")) {
        const changed = el.value !== el.dataset.value && !(el.type === "password" && el.value === "");
        el.closest(".setting").classList.toggle("changed", changed);
        if (changed) n += 1;
      }
      count.textContent = n ? `${n} changed` : "";
    };
    const refused = settings.querySelector(".setting.refused");
    if (refused) {  // the setting the loader refused: in view, ready to correct
      refused.scrollIntoView({ block: "center" });
      refused.querySelector("input, select").focus({ preventScroll: true });
    }
    settings.addEventListener("input", update);
    settings.addEventListener("change", update);
    update();
  }
  // Knowledge graph: the as-of slider sets the date and shows the graph then.
  const slider = document.getElementById("as-of-slider");
  if (slider) {
    const field = document.getElementById("as-of");
    const day = () => {
      const d = new Date(slider.dataset.start + "T00:00:00Z");
      d.setUTCDate(d.getUTCDate() + Number(slider.value));
      return d.toISOString().slice(0, 10) + "T23:59:59Z";  // the end of that day
    };
    slider.addEventListener("input", () => { field.value = day(); });
    slider.addEventListener("change", () => { field.value = day(); document.getElementById("graph-form").submit(); });
  }
});
